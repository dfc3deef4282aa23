package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

func get(t *testing.T, url string) *http.Response {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp
}

func TestServerLocal(t *testing.T) {
	l, h, err := newServer(config{rules: "2/1m,100/1h"}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer func() { _ = l.Close(context.Background()) }()
	srv := httptest.NewServer(h)
	defer srv.Close()

	codes := []int{}
	for range 3 {
		resp := get(t, srv.URL+"/hello")
		codes = append(codes, resp.StatusCode)
		assert.Equal(t, `"1m";q=2;w=60, "1h";q=100;w=3600`, resp.Header.Get("RateLimit-Policy"))
	}
	assert.Equal(t, []int{200, 200, 429}, codes)
	assert.Equal(t, 200, get(t, srv.URL+"/stats").StatusCode, "/stats is not limited")
	assert.Equal(t, hybridlimit.ModeLocal, l.Mode())
}

// TestServerKeyHeader: -key-header keys on that header; a name no
// request could carry is refused at startup.
func TestServerKeyHeader(t *testing.T) {
	_, _, err := newServer(config{rules: "1/1m", keyHeader: "X API Key"}, slog.New(slog.DiscardHandler))
	assert.EqualError(t, err, "httplimit: Header(name=\"X API Key\"): want a header field name: letters, digits and !#$%&'*+-.^_`|~")

	l, h, err := newServer(config{rules: "1/1m", keyHeader: "X-API-Key"}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer func() { _ = l.Close(context.Background()) }()
	srv := httptest.NewServer(h)
	defer srv.Close()
	codes := []int{}
	for _, k := range []string{"a", "b", "a", ""} {
		req, err := http.NewRequest("GET", srv.URL+"/hello", nil)
		require.NoError(t, err)
		if k != "" {
			req.Header.Set("X-API-Key", k)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	assert.Equal(t, []int{200, 200, 429, 400}, codes)
}

func TestServerRedis(t *testing.T) {
	addr := redistest.Addr(t)
	c := config{rules: "3/1h", redisAddr: addr, prefix: redistest.Prefix(t), syncRate: 10 * time.Millisecond}
	var nodes []*httptest.Server
	for range 2 {
		l, h, err := newServer(c, slog.New(slog.DiscardHandler))
		require.NoError(t, err)
		defer func() { _ = l.Close(context.Background()) }()
		assert.Equal(t, hybridlimit.ModeAsync, l.Mode())
		srv := httptest.NewServer(h)
		defer srv.Close()
		nodes = append(nodes, srv)
	}
	// Node 0 takes the whole quota; once it has synced, node 1 denies.
	for range 3 {
		require.Equal(t, 200, get(t, nodes[0].URL+"/hello").StatusCode)
	}
	require.Eventually(t, func() bool {
		return get(t, nodes[1].URL+"/hello").StatusCode == 429
	}, 5*time.Second, 20*time.Millisecond)
}

func TestParseRules(t *testing.T) {
	rules, err := parseRules("5/1s, 100/1m:fixed")
	require.NoError(t, err)
	assert.Equal(t, []hybridlimit.Rule{{Limit: 5, Window: time.Second}, {Limit: 100, Window: time.Minute, Type: hybridlimit.Fixed}}, rules)
	for _, bad := range []string{"5", "x/1s", "5/x"} {
		_, err := parseRules(bad)
		assert.Error(t, err, bad)
	}
	_, _, err = newServer(config{rules: "0/1s"}, slog.New(slog.DiscardHandler))
	assert.ErrorContains(t, err, "Config.Rules[0].Limit is 0")
}
