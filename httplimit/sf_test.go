package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/httplimit"
)

// sfItem is one member of a structured-field List (RFC 9651) whose bare
// item is a String, as the rate-limit draft's fields are.
type sfItem struct {
	Name   string
	Params map[string]string // value as written: integer digits, or "…" / :…: verbatim
	Order  []string
}

// parseSFList parses a List of String Items with parameters, following
// RFC 9651 section 4.2 for the subset the draft uses (String bare items;
// Integer, String, Byte Sequence and Token parameter values). It rejects
// anything else, so it checks the syntax of our fields strictly.
func parseSFList(s string) ([]sfItem, error) {
	var out []sfItem
	s = strings.TrimLeft(s, " ")
	for {
		if !strings.HasPrefix(s, `"`) {
			return nil, fmt.Errorf("item must be a String at %q", s)
		}
		name, rest, err := parseSFString(s)
		if err != nil {
			return nil, err
		}
		it := sfItem{Name: name, Params: map[string]string{}}
		s = rest
		for strings.HasPrefix(s, ";") {
			s = strings.TrimLeft(s[1:], " ")
			i := 0
			for i < len(s) && (s[i] >= 'a' && s[i] <= 'z' || s[i] >= '0' && s[i] <= '9' || s[i] == '_' || s[i] == '-' || s[i] == '.' || s[i] == '*') {
				i++
			}
			if i == 0 || s[0] < 'a' || s[0] > 'z' && s[0] != '*' {
				return nil, fmt.Errorf("bad parameter key at %q", s)
			}
			k := s[:i]
			s = s[i:]
			v := "?1"
			if strings.HasPrefix(s, "=") {
				s = s[1:]
				switch {
				case strings.HasPrefix(s, `"`):
					str, rest, err := parseSFString(s)
					if err != nil {
						return nil, err
					}
					v, s = strconv.Quote(str), rest
				case strings.HasPrefix(s, ":"):
					j := strings.IndexByte(s[1:], ':')
					if j < 0 {
						return nil, fmt.Errorf("unterminated byte sequence")
					}
					v, s = s[:j+2], s[j+2:]
				default:
					j := 0
					if j < len(s) && s[j] == '-' {
						j++
					}
					for j < len(s) && s[j] >= '0' && s[j] <= '9' {
						j++
					}
					if j == 0 || j > 15 {
						return nil, fmt.Errorf("bad integer at %q", s)
					}
					v, s = s[:j], s[j:]
				}
			}
			if _, dup := it.Params[k]; !dup {
				it.Order = append(it.Order, k)
			}
			it.Params[k] = v
		}
		out = append(out, it)
		s = strings.TrimLeft(s, " \t")
		if s == "" {
			return out, nil
		}
		if s[0] != ',' {
			return nil, fmt.Errorf("expected ',' at %q", s)
		}
		s = strings.TrimLeft(s[1:], " \t")
		if s == "" {
			return nil, fmt.Errorf("trailing comma")
		}
	}
}

func parseSFString(s string) (string, string, error) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			if i+1 >= len(s) || s[i+1] != '"' && s[i+1] != '\\' {
				return "", "", fmt.Errorf("bad escape in %q", s)
			}
			i++
			b.WriteByte(s[i])
		case c == '"':
			return b.String(), s[i+1:], nil
		case c < 0x20 || c > 0x7e:
			return "", "", fmt.Errorf("non-printable byte in %q", s)
		default:
			b.WriteByte(c)
		}
	}
	return "", "", fmt.Errorf("unterminated string %q", s)
}

// TestDraftExamples checks the parser on the examples of
// draft-ietf-httpapi-ratelimit-headers-11 (sections 3.2 and 4.2), then our
// fields against the same examples: for the same policies our
// serialization must parse to the same items, and be the canonical
// serialization (RFC 9651 section 4.1: ", " between members).
func TestDraftExamples(t *testing.T) {
	examples := map[string][]sfItem{
		`"default";q=100;w=10`: {{Name: "default", Params: map[string]string{"q": "100", "w": "10"}, Order: []string{"q", "w"}}},
		`"permin";q=50;w=60,"perhr";q=1000;w=3600`: {
			{Name: "permin", Params: map[string]string{"q": "50", "w": "60"}, Order: []string{"q", "w"}},
			{Name: "perhr", Params: map[string]string{"q": "1000", "w": "3600"}, Order: []string{"q", "w"}},
		},
		`"peruser";q=100;w=60;pk=:cHsdsRa894==:`: {{Name: "peruser", Params: map[string]string{"q": "100", "w": "60", "pk": ":cHsdsRa894==:"}, Order: []string{"q", "w", "pk"}}},
		`"default";r=50;t=30`:                    {{Name: "default", Params: map[string]string{"r": "50", "t": "30"}, Order: []string{"r", "t"}}},
		`"problemPolicy";r=0;t=10`:               {{Name: "problemPolicy", Params: map[string]string{"r": "0", "t": "10"}, Order: []string{"r", "t"}}},
	}
	for ex, want := range examples {
		got, err := parseSFList(ex)
		require.NoError(t, err, ex)
		assert.Equal(t, want, got, ex)
	}
	for _, bad := range []string{`default;q=1`, `"a";q=1,`, `"a";Q=1`, `"a" "b"`, `"a\x";q=1`, `"a";q=1.5.5`} {
		_, err := parseSFList(bad)
		assert.Error(t, err, bad)
	}

	// Our fields for the draft's two-policy example.
	l, _ := newLocal(t, hybridlimit.Rule{Limit: 50, Window: time.Minute}, hybridlimit.Rule{Limit: 1000, Window: time.Hour})
	m, err := httplimit.New(l, header(t, "K"), httplimit.Options{PolicyNames: []string{"permin", "perhr"}})
	require.NoError(t, err)
	w := doKey(m, "k")
	policy := w.Header.Get("RateLimit-Policy")
	assert.Equal(t, `"permin";q=50;w=60, "perhr";q=1000;w=3600`, policy)
	got, err := parseSFList(policy)
	require.NoError(t, err)
	assert.Equal(t, examples[`"permin";q=50;w=60,"perhr";q=1000;w=3600`], got)

	rl := w.Header.Get("RateLimit")
	items, err := parseSFList(rl)
	require.NoError(t, err, rl)
	require.Len(t, items, 2)
	for i, name := range []string{"permin", "perhr"} {
		assert.Equal(t, name, items[i].Name)
		assert.Equal(t, []string{"r", "t"}, items[i].Order, "r and t, in the draft's order")
	}

	// The draft's single-policy examples, produced by our middleware: a
	// fixed policy of 100 per 10s, after 50 requests at the window's start.
	l, _ = newLocal(t, hybridlimit.Rule{Limit: 100, Window: 10 * time.Second, Type: hybridlimit.Fixed})
	m, err = httplimit.New(l, header(t, "K"), httplimit.Options{PolicyNames: []string{"default"}})
	require.NoError(t, err)
	for range 49 {
		doKey(m, "k")
	}
	w = doKey(m, "k")
	assert.Equal(t, `"default";q=100;w=10`, w.Header.Get("RateLimit-Policy"))
	assert.Equal(t, `"default";r=50;t=10`, w.Header.Get("RateLimit"))
}

func doKey(m *httplimit.Middleware, key string) *http.Response {
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("K", key)
	w := httptest.NewRecorder()
	m.Wrap(ok).ServeHTTP(w, r)
	return w.Result()
}
