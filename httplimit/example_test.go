package httplimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/httplimit"
)

// A handler behind the middleware: 2 requests per minute per client IP,
// decided on this node alone (ModeLocal). A mock clock makes the headers
// exact; a server leaves Config.Clock nil.
func Example() {
	mc := clock.NewMock()
	mc.Set(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)) // the start of a minute
	l, err := hybridlimit.New(hybridlimit.Config{
		Rules:  []hybridlimit.Rule{{Limit: 2, Window: time.Minute}},
		Clock:  mc,
		Manual: true, // no background goroutines: the example drives time
	})
	if err != nil {
		panic(err)
	}
	defer l.Close(context.Background())

	key, err := httplimit.ClientIP(httplimit.IPOptions{})
	if err != nil {
		panic(err)
	}
	mw, err := httplimit.New(l, key, httplimit.Options{})
	if err != nil {
		panic(err)
	}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))

	get := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/hello", nil)
		r.RemoteAddr = "192.0.2.1:1234"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%d RateLimit: %s", w.Code, w.Header().Get("RateLimit"))
		if ra := w.Header().Get("Retry-After"); ra != "" {
			fmt.Printf("  Retry-After: %s  %s", ra, w.Header().Get("Content-Type"))
		}
		fmt.Println()
		return w
	}
	w := get()
	fmt.Println("RateLimit-Policy:", w.Header().Get("RateLimit-Policy"))
	get()
	get()                    // over the limit: 429, Retry-After and a problem+json body
	mc.Add(90 * time.Second) // 30 s into the next minute: the first two weigh half
	get()
	// Output:
	// 200 RateLimit: "1m";r=1;t=120
	// RateLimit-Policy: "1m";q=2;w=60
	// 200 RateLimit: "1m";r=0;t=120
	// 429 RateLimit: "1m";r=0;t=90  Retry-After: 90  application/problem+json
	// 200 RateLimit: "1m";r=0;t=90
}
