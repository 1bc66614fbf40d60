package proxy

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"
)

// Jupyter's pages carry the server's own token for their scripts
// (notebook 6 and jupyter_server render data-jupyter-api-token="<token>"
// into every page of a signed-in user). The proxy authenticates for the
// browser, so the browser never needs it: the token is removed from every
// text answer on its way out (ARCHITECTURE.md invariant 7). Upstream
// requests ask for identity encoding, so answers are never compressed
// between the proxy and the notebook and the scan sees the real bytes.

// textual reports whether an answer with these headers is text the proxy
// scans for the token: HTML, JavaScript, JSON, XML and other text (and
// untyped answers, to be safe).
func textual(h http.Header) bool {
	ct, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	if err != nil {
		return h.Get("Content-Type") == "" // untyped: scan, to be safe
	}
	return strings.HasPrefix(ct, "text/") || strings.HasSuffix(ct, "json") || strings.HasSuffix(ct, "javascript") ||
		strings.HasSuffix(ct, "xml") || ct == "application/x-ipynb+json"
}

// errCompressedText is a text answer the notebook compressed although the
// proxy asked for none: it cannot be checked for the token, so it is not
// passed on.
var errCompressedText = errors.New("the notebook sent compressed text, which the proxy cannot check for its token")

// scrub makes resp's body lose every occurrence of token, when it is text.
func scrub(resp *http.Response, token string) error {
	if token == "" || resp.StatusCode == http.StatusSwitchingProtocols || !textual(resp.Header) {
		return nil
	}
	if enc := resp.Header.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		return errCompressedText
	}
	resp.Body = newScrubber(resp.Body, token)
	resp.ContentLength = -1
	resp.Header.Del("Content-Length")
	return nil
}

// scrubber is a reader that removes every occurrence of secret from r's
// bytes. It holds back only the bytes that could begin an occurrence
// split across two reads, so a stream keeps flowing.
type scrubber struct {
	r      io.ReadCloser
	secret []byte
	buf    []byte // one read's worth, allocated on first use
	in     []byte // read, not yet scanned past the held-back tail
	out    []byte // scanned, ready to return
	eof    bool
	err    error
}

func newScrubber(r io.ReadCloser, secret string) *scrubber {
	return &scrubber{r: r, secret: []byte(secret)}
}

func (s *scrubber) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		if s.eof {
			if len(s.in) > 0 {
				s.out, s.in = s.in, nil
				break
			}
			return 0, s.err
		}
		if s.buf == nil {
			s.buf = make([]byte, 8<<10)
		}
		n, err := s.r.Read(s.buf)
		s.in = append(s.in, s.buf[:n]...)
		if err != nil {
			s.eof, s.err = true, err
		}
		s.scan()
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	return n, nil
}

// scan moves the bytes of in that cannot be part of an occurrence to out,
// without the occurrences.
func (s *scrubber) scan() {
	for {
		i := bytes.Index(s.in, s.secret)
		if i < 0 {
			break
		}
		s.out = append(s.out, s.in[:i]...)
		s.in = s.in[i+len(s.secret):]
	}
	keep := 0
	if !s.eof {
		keep = overlap(s.in, s.secret)
	}
	s.out = append(s.out, s.in[:len(s.in)-keep]...)
	s.in = append([]byte(nil), s.in[len(s.in)-keep:]...)
}

// overlap is the length of the longest suffix of b that is a proper prefix
// of secret.
func overlap(b, secret []byte) int {
	for n := min(len(b), len(secret)-1); n > 0; n-- {
		if bytes.HasPrefix(secret, b[len(b)-n:]) {
			return n
		}
	}
	return 0
}

func (s *scrubber) Close() error { return s.r.Close() }
