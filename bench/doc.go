// Package bench measures hybridlimit beside the Go rate limiters users would
// pick instead, in one run, on one machine and against one redis-server:
// golang.org/x/time/rate, github.com/ulule/limiter/v3,
// github.com/sethvargo/go-limiter, github.com/throttled/throttled/v2 and
// github.com/go-redis/redis_rate/v10.
//
// It is a nested module so that the peers never enter hybridlimit's own
// go.mod. Everything lives in its tests: the benchmarks (BenchmarkLocal,
// BenchmarkDistributed, BenchmarkSync, BenchmarkMemory), whose names encode
// their parameters for benchstat, and a smoke test that checks every peer
// adapter admits exactly its limit. The command bench/report runs the
// benchmarks and prints the markdown tables of docs/performance.md:
//
//	go run ./bench/report
//
// Benchmarks that need Redis read its address from $HYBRIDLIMIT_REDIS_ADDR
// (see internal/redistest); bench/report starts a redis-server itself when
// the variable is unset.
package bench
