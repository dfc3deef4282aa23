package httplimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/httplimit"
)

// BenchmarkMiddleware measures the middleware's overhead over a bare
// handler: the same handler and the same pre-built requests, with and
// without the middleware; the overhead is the difference between
// handler:bare and handler:limited at equal parameters. The limiter runs in
// ModeLocal with limits that never deny (the allowed path, every header
// set); ModeAsync decides the same way, with no I/O.
//
// writer:recorder uses a fresh httptest.ResponseRecorder per request,
// whose WriteHeader clones the header map (so it also pays for copying our
// five headers); writer:minimal reuses one cleared header map and measures
// the middleware alone.
func BenchmarkMiddleware(b *testing.B) {
	for _, c := range []struct {
		rules, keys int // rules 0: no middleware
		par         bool
	}{
		{0, 1, false}, {1, 1, false}, {4, 1, false},
		{0, 10000, false}, {1, 10000, false},
		{0, 10000, true}, {1, 10000, true},
	} {
		for _, writer := range []string{"recorder", "minimal"} {
			name := "handler:bare"
			if c.rules > 0 {
				name = fmt.Sprintf("handler:limited;rules:%d", c.rules)
			}
			name += fmt.Sprintf(";keys:%d;writer:%s", c.keys, writer)
			if c.par {
				name += ";goroutines:gomaxprocs"
			}
			b.Run(name, func(b *testing.B) { benchMiddleware(b, c.rules, c.keys, c.par, writer == "recorder") })
		}
	}
}

// minimalWriter is a ResponseWriter that keeps nothing but its header map.
type minimalWriter struct {
	h    http.Header
	code int
}

func (w *minimalWriter) Header() http.Header         { return w.h }
func (w *minimalWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *minimalWriter) WriteHeader(code int)        { w.code = code }

func benchMiddleware(b *testing.B, nrules, nkeys int, par, recorder bool) {
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
	})
	if nrules > 0 {
		windows := []time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour}
		var rules []hybridlimit.Rule
		for _, w := range windows[:nrules] {
			rules = append(rules, hybridlimit.Rule{Limit: hybridlimit.MaxLimit, Window: w})
		}
		l, err := hybridlimit.New(hybridlimit.Config{Rules: rules})
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = l.Close(context.Background()) }()
		key, _ := httplimit.ClientIP(httplimit.IPOptions{})
		m, err := httplimit.New(l, key, httplimit.Options{})
		if err != nil {
			b.Fatal(err)
		}
		h = m.Wrap(h)
	}
	reqs := make([]*http.Request, nkeys)
	for i := range reqs {
		reqs[i] = httptest.NewRequest("GET", "/", nil)
		reqs[i].RemoteAddr = fmt.Sprintf("10.%d.%d.%d:4242", i>>16&255, i>>8&255, i&255)
		h.ServeHTTP(httptest.NewRecorder(), reqs[i]) // create the key
	}
	serve := func(mw *minimalWriter, r *http.Request) {
		if recorder {
			h.ServeHTTP(httptest.NewRecorder(), r)
			return
		}
		clear(mw.h)
		h.ServeHTTP(mw, r)
	}
	b.ReportAllocs()
	if par {
		var start atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			mw := &minimalWriter{h: http.Header{}}
			// Each goroutine walks the keys from its own offset.
			for i := int(start.Add(int64(nkeys/2 + 1))); pb.Next(); i += 7 {
				serve(mw, reqs[i%len(reqs)])
			}
		})
		return
	}
	mw := &minimalWriter{h: http.Header{}}
	for i := 0; b.Loop(); i++ {
		serve(mw, reqs[i%len(reqs)])
	}
}

// BenchmarkDecisionOnly is the part of the middleware's cost that is the
// limiter's: the key function and AllowN, without headers, for comparison
// with BenchmarkMiddleware in the same run.
func BenchmarkDecisionOnly(b *testing.B) {
	l, err := hybridlimit.New(hybridlimit.Config{Rules: []hybridlimit.Rule{{Limit: hybridlimit.MaxLimit, Window: time.Second}}})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = l.Close(context.Background()) }()
	key, _ := httplimit.ClientIP(httplimit.IPOptions{})
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "10.0.0.1:4242"
	b.ReportAllocs()
	for b.Loop() {
		k, _ := key(r)
		if _, err := l.AllowN(r.Context(), k, 1); err != nil {
			b.Fatal(err)
		}
	}
}
