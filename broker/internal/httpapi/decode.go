package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// decodeJSON reads exactly one JSON object from the request body into dst,
// refusing unknown fields. Errors wrap fleet.ErrInvalid and say what and
// where, in words a person can act on; a body over the limit keeps its
// *http.MaxBytesError (413).
func decodeJSON(c echo.Context, dst any) error {
	dec := json.NewDecoder(c.Request().Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return jsonProblem(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return err
		}
		return fmt.Errorf("the body has more data after the JSON object: %w", fleet.ErrInvalid)
	}
	return nil
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
	case goType == "string" || strings.HasSuffix(goType, "ServerState"):
		return "a string"
	case strings.HasPrefix(goType, "map["):
		return "an object"
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	case goType == "bool":
		return "true or false"
	case strings.HasPrefix(goType, "int") || strings.HasPrefix(goType, "uint") || strings.HasPrefix(goType, "float"):
		return "a number"
	default:
		return "an object"
	}
}
