package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"unicode/utf8"

	"github.com/hybridlimit/hybridlimit"
)

// Denials and errors: the default problem+json bodies, ResultFrom for
// Options.DeniedHandler, and DefaultErrorHandler.

// ProblemType is the RFC 9457 problem type of the default denial body, the
// "quota exceeded" type that the rate-limit headers draft registers.
const ProblemType = "https://iana.org/assignments/http-problem-types#quota-exceeded"

type resultKey struct{}

// ResultFrom returns the decision of a denied request, inside
// Options.DeniedHandler.
func ResultFrom(r *http.Request) (hybridlimit.Result, bool) {
	res, ok := r.Context().Value(resultKey{}).(hybridlimit.Result)
	return res, ok
}

// deny answers a denied request.
func (m *Middleware) deny(w http.ResponseWriter, r *http.Request, key string, res *hybridlimit.Result, n, retry int64) {
	if m.opts.DeniedHandler != nil {
		m.opts.DeniedHandler.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), resultKey{}, *res)))
		return
	}
	status, title := m.status, "Too Many Requests"
	if res.Blocked {
		status, title = m.blocked, "Blocked"
	}
	t := m.tierOf(res)
	// The violated policies: every rule that cannot admit the request now
	// (none for a blocked key, or for a denial by the FailurePolicy).
	violated := make([]string, 0, 1)
	failed := m.failedClosed(res)
	switch {
	case res.Blocked || failed:
	case t.multi:
		var st [hybridlimit.MaxRules]hybridlimit.RuleState
		// The decision's rules, wherever the key is now; the decision's
		// own rule if the limiter was closed since.
		states, err := m.l.TierState(r.Context(), key, res.Tier, st[:0])
		if err != nil {
			states = append(states[:0], hybridlimit.RuleState{Rule: res.Rule, Remaining: res.Remaining})
		}
		for _, s := range states {
			if s.Rule >= 0 && s.Rule < len(t.policy.names) && (s.Remaining < n || s.Rule == res.Rule) {
				violated = append(violated, t.policy.names[s.Rule])
			}
		}
	default:
		violated = append(violated, t.policy.names[0])
	}
	typ, detail := ProblemType, fmt.Sprintf("rate limit exceeded; retry after %d s", retry)
	switch {
	case res.Blocked:
		typ, detail = "about:blank", fmt.Sprintf("this client is blocked; retry after %d s", retry)
	case failed:
		typ, detail = "about:blank", fmt.Sprintf("the rate limiter cannot decide and fails closed; retry after %d s", retry)
	}
	b := make([]byte, 0, 256)
	b = append(b, `{"type":`...)
	b = strconv.AppendQuote(b, typ)
	b = append(b, `,"title":`...)
	b = strconv.AppendQuote(b, title)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"detail":`...)
	b = strconv.AppendQuote(b, detail)
	b = append(b, `,"violated-policies":[`...)
	for i, name := range violated {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendQuote(b, name) // printable ASCII: valid JSON
	}
	b = append(b, "]}\n"...)
	writeProblem(w, status, b)
}

// fail answers a request that could not be decided.
func (m *Middleware) fail(w http.ResponseWriter, r *http.Request, err error) {
	if m.opts.ErrorHandler != nil {
		m.opts.ErrorHandler(w, r, err)
		return
	}
	DefaultErrorHandler(w, r, err)
}

// DefaultErrorHandler is the ErrorHandler used when Options.ErrorHandler is
// nil: 503 Service Unavailable for a closed limiter or a done request
// context, 500 Internal Server Error when Config.TierOf named a tier the
// limiter does not have (hybridlimit.ErrUnknownTier: the server's
// configuration is at fault), 400 Bad Request otherwise (a key error, an
// empty or oversized key, a cost out of range), with a problem+json body
// naming the error.
func DefaultErrorHandler(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusBadRequest
	switch {
	case errors.Is(err, hybridlimit.ErrClosed) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		status = http.StatusServiceUnavailable
	case errors.Is(err, hybridlimit.ErrUnknownTier):
		status = http.StatusInternalServerError
	}
	b := make([]byte, 0, 256)
	b = append(b, `{"title":`...)
	b = strconv.AppendQuote(b, http.StatusText(status))
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"detail":`...)
	b = appendJSONString(b, err.Error())
	b = append(b, "}\n"...)
	writeProblem(w, status, b)
}

func writeProblem(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// appendJSONString appends s as a JSON string, escaping what JSON
// requires and replacing invalid UTF-8.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for _, c := range s { // ranging a string yields U+FFFD for invalid bytes
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', byte(c))
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = utf8.AppendRune(b, c)
		}
	}
	return append(b, '"')
}
