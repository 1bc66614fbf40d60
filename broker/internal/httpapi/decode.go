package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// errMediaType marks a request body that is not JSON (415).
var errMediaType = errors.New("httpapi: unsupported media type")

// decodeJSON reads exactly one JSON object from the request body into dst,
// strictly: the body must be application/json (charset utf-8, if one is
// named; else errMediaType, 415), valid UTF-8, with every object key given
// once and spelled as the field is (names are case-sensitive), no unknown
// fields, and numbers that fit their fields. Errors wrap fleet.ErrInvalid
// and name the field ("env.A", "args[2]") in words a person can act on; a
// body over the limit keeps its *http.MaxBytesError (413).
func decodeJSON(c echo.Context, dst any) error {
	req := c.Request()
	body, err := io.ReadAll(req.Body)
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return err
		}
		return fmt.Errorf("read the body: %w", err)
	}
	if err := jsonMediaType(req.Header.Get(echo.HeaderContentType), len(body) > 0); err != nil {
		return err
	}
	if err := scanJSON(body, reflect.TypeOf(dst)); err != nil {
		return err
	}
	if string(bytes.TrimSpace(body)) == "null" {
		// encoding/json takes null for any object as "no change": a body
		// that asks for nothing must say so, not pass as an empty object.
		return fmt.Errorf("the body holds JSON null where an object is expected: %w", fleet.ErrInvalid)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return jsonProblem(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("the body has more data after the JSON object: %w", fleet.ErrInvalid)
	}
	return nil
}

// jsonMediaType checks a request's Content-Type: application/json, with no
// charset or utf-8. A missing one is accepted only without a body (which
// is then the "empty body" problem, a 400).
func jsonMediaType(ct string, hasBody bool) error {
	if ct == "" {
		if hasBody {
			return fmt.Errorf("%w: the request has a body but no Content-Type; send it as application/json", errMediaType)
		}
		return nil
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return fmt.Errorf("%w: the body is %q; send it as application/json", errMediaType, ct)
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return fmt.Errorf("%w: the body's charset is %q; JSON is UTF-8", errMediaType, cs)
	}
	return nil
}

// scanJSON walks body alongside the Go type it decodes into and reports,
// with the field's path, the first invalid UTF-8 (which encoding/json
// would silently replace), duplicate key, key that matches a field only
// when case is ignored (which encoding/json would silently accept) or
// unknown field. Syntax and type errors are left to the decoder, which
// words them; scanJSON then returns nil.
func scanJSON(body []byte, t reflect.Type) error {
	bad := -1
	if !utf8.Valid(body) {
		for i := 0; i < len(body); {
			r, n := utf8.DecodeRune(body[i:])
			if r == utf8.RuneError && n <= 1 {
				bad = i
				break
			}
			i += n
		}
	}
	s := &scanner{dec: json.NewDecoder(bytes.NewReader(body)), bad: bad}
	s.dec.UseNumber()
	err := s.value(t, "")
	var p *scanProblem
	if errors.As(err, &p) {
		return fmt.Errorf("%s: %w", p.msg, fleet.ErrInvalid)
	}
	if bad >= 0 {
		return fmt.Errorf("the body is not valid UTF-8 (byte %d): %w", bad, fleet.ErrInvalid)
	}
	return nil // a syntax or type problem: the decoder says which
}

// scanProblem is a problem scanJSON found; other errors end the scan
// quietly.
type scanProblem struct{ msg string }

func (p *scanProblem) Error() string { return p.msg }

type scanner struct {
	dec *json.Decoder
	bad int // offset of the first invalid UTF-8 byte, or -1
}

// token reads the next token and reports invalid UTF-8 inside it at path.
func (s *scanner) token(path string) (json.Token, error) {
	tok, err := s.dec.Token()
	if err != nil {
		return nil, err
	}
	if s.bad >= 0 && s.dec.InputOffset() > int64(s.bad) {
		return nil, &scanProblem{fmt.Sprintf("%s is not valid UTF-8", describe(path))}
	}
	return tok, nil
}

// describe names a path for people: "the body" or "field \"env.A\"".
func describe(path string) string {
	if path == "" {
		return "the body"
	}
	return fmt.Sprintf("field %q", path)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// value scans one JSON value that decodes into t at path.
func (s *scanner) value(t reflect.Type, path string) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tok, err := s.token(path)
	if err != nil {
		return err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil // a scalar: its type and range are the decoder's to check
	}
	switch {
	case d == '{' && t != nil && t.Kind() == reflect.Struct:
		return s.object(path, structFields(t))
	case d == '{' && t != nil && t.Kind() == reflect.Map:
		elem := t.Elem()
		return s.object(path, func(string) (reflect.Type, string, bool) { return elem, "", true })
	case d == '[' && t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array):
		for i := 0; s.dec.More(); i++ {
			if err := s.value(t.Elem(), path+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
		_, err := s.token(path)
		return err
	}
	// A value of another shape than t: the decoder reports it; skip it.
	return s.skip(d, path)
}

// object scans an object's members; field resolves a key to its type, or
// to the spelling it should have (found false).
func (s *scanner) object(path string, field func(key string) (reflect.Type, string, bool)) error {
	seen := map[string]bool{}
	for s.dec.More() {
		tok, err := s.token(path)
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		at := join(path, key)
		if seen[key] {
			return &scanProblem{fmt.Sprintf("%s is given twice", describe(at))}
		}
		seen[key] = true
		t, spelled, ok := field(key)
		switch {
		case !ok && spelled != "":
			return &scanProblem{fmt.Sprintf("%s is spelled %q in this API (names are case-sensitive)", describe(at), join(path, spelled))}
		case !ok:
			return &scanProblem{fmt.Sprintf("the body has an unknown field %q", at)}
		}
		if err := s.value(t, at); err != nil {
			return err
		}
	}
	_, err := s.token(path)
	return err
}

// skip reads past the rest of a value that started with d.
func (s *scanner) skip(d json.Delim, path string) error {
	if d == '}' || d == ']' {
		return nil
	}
	for depth := 1; depth > 0; {
		tok, err := s.token(path)
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
	return nil
}

// structFields resolves JSON keys of struct t the way encoding/json
// names its fields (the json tag's name, else the Go name; embedded
// structs' fields promoted), but case-sensitively.
func structFields(t reflect.Type) func(key string) (reflect.Type, string, bool) {
	byName := map[string]reflect.Type{}
	var add func(t reflect.Type)
	add = func(t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, _, _ := strings.Cut(tag, ",")
			if f.Anonymous && name == "" {
				ft := f.Type
				if ft.Kind() == reflect.Pointer {
					ft = ft.Elem()
				}
				if ft.Kind() == reflect.Struct {
					add(ft)
					continue
				}
			}
			if !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			byName[name] = f.Type
		}
	}
	add(t)
	return func(key string) (reflect.Type, string, bool) {
		if ft, ok := byName[key]; ok {
			return ft, "", true
		}
		for name := range byName {
			if strings.EqualFold(name, key) {
				return nil, name, false
			}
		}
		return nil, "", false
	}
}

// jsonProblem turns a decoding error into a readable one.
func jsonProblem(err error) error {
	var (
		mb     *http.MaxBytesError
		syntax *json.SyntaxError
		typ    *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &mb):
		return err
	case errors.Is(err, io.EOF):
		return fmt.Errorf("the body is empty; a JSON object is expected: %w", fleet.ErrInvalid)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("the body ends before the JSON object is complete: %w", fleet.ErrInvalid)
	case errors.As(err, &syntax):
		return fmt.Errorf("the body is not valid JSON at byte %d: %s: %w", syntax.Offset, strings.TrimPrefix(syntax.Error(), "json: "), fleet.ErrInvalid)
	case errors.As(err, &typ):
		where := "the body"
		if typ.Field != "" {
			where = fmt.Sprintf("field %q", typ.Field)
		}
		kind := jsonKind(typ.Type.String())
		if kind == "a number" && strings.HasPrefix(typ.Value, "number") {
			return fmt.Errorf("%s holds %s, which is not a whole number in range (byte %d): %w", where, typ.Value, typ.Offset, fleet.ErrInvalid)
		}
		return fmt.Errorf("%s holds a JSON %s where %s is expected (byte %d): %w", where, typ.Value, kind, typ.Offset, fleet.ErrInvalid)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		// encoding/json has no typed error for unknown fields; its text is
		// `json: unknown field "name"`, stable since Go 1.10.
		return fmt.Errorf("the body has an %s: %w", strings.TrimPrefix(err.Error(), "json: "), fleet.ErrInvalid)
	default:
		return fmt.Errorf("the body is not a valid JSON object: %w", fleet.ErrInvalid)
	}
}

// jsonKind names a Go type the way a JSON author thinks of it.
func jsonKind(goType string) string {
	switch {
	case goType == "string" || strings.HasSuffix(goType, "ServerState") || strings.HasSuffix(goType, "ReclaimAction"):
		return "a string"
	case strings.HasPrefix(goType, "map["):
		return "an object"
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	case goType == "bool":
		return "true or false"
	case strings.HasPrefix(goType, "int") || strings.HasPrefix(goType, "uint") || strings.HasPrefix(goType, "float") || strings.HasPrefix(goType, "*int"):
		return "a number"
	default:
		return "an object"
	}
}
