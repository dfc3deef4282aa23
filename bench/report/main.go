// Command report runs hybridlimit's side-by-side benchmarks (the bench
// module) and prints their results as markdown: one table per family with
// ns/op, allocs/op and the ratio of each peer to hybridlimit measured in the
// same run, then the project's performance goals and whether this run
// meets each.
//
// Run it from the repository root (or from bench/):
//
//	go run ./bench/report                 # about 11 minutes on 2 cores (the Rotation family 4)
//	go run ./bench/report -count 3        # median of 3 runs per benchmark
//	go run ./bench/report -raw bench.txt  # also keep go test's output, for benchstat
//
// Benchmarks that need Redis use $HYBRIDLIMIT_REDIS_ADDR; when it is unset,
// report starts a redis-server (from $PATH) on a free loopback port without
// persistence, and stops it at the end.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

func main() {
	benchtime := flag.String("benchtime", "1s", "go test -benchtime for the timed families (Memory always runs 1x)")
	count := flag.Int("count", 1, "runs per benchmark; the table shows the median")
	families := flag.String("families", "Local,Distributed,Sync,Memory,Instructions,Rotation", "benchmark families to run, comma-separated (Instructions: scripts/instructions.sh under callgrind; Rotation: the goals' timed cases in separate processes, round after round)")
	rounds := flag.Int("rounds", 7, "rounds of the Rotation family; its tables show the median")
	raw := flag.String("raw", "", "also write go test's raw output to this file (benchstat input)")
	flag.Parse()
	if *rounds < 1 || *count < 1 {
		fmt.Fprintln(os.Stderr, "report: -count and -rounds must be at least 1")
		os.Exit(2)
	}
	if err := run(*benchtime, *count, *rounds, strings.Split(*families, ","), *raw); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}

func run(benchtime string, count, rounds int, families []string, rawPath string) error {
	dir, err := benchDir()
	if err != nil {
		return err
	}
	if os.Getenv("HYBRIDLIMIT_REDIS_ADDR") == "" {
		stop, err := startRedis()
		if err != nil {
			return err
		}
		defer stop()
	}
	var out bytes.Buffer
	start := time.Now()
	var instr []instruction
	for _, f := range families {
		if f == "Instructions" {
			if instr, err = instructions(dir); err != nil {
				return err
			}
			continue
		}
		if f == "Rotation" {
			if err := rotation(dir, benchtime, rounds, &out); err != nil {
				return err
			}
			continue
		}
		bt := benchtime
		if f == "Memory" {
			bt = "1x"
		}
		pattern := "^Benchmark" + f + "$"
		if f == "Distributed" {
			pattern = "^Benchmark(Distributed|TakeScript)$" // the synchronous mode's ceiling beside it
		}
		args := []string{"test", "-run", "^$", "-bench", pattern, "-benchmem",
			"-benchtime", bt, "-count", strconv.Itoa(count), "-timeout", "30m", "."}
		fmt.Fprintf(os.Stderr, "== go %s (in %s)\n", strings.Join(args, " "), dir)
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Stdout = io.MultiWriter(&out, os.Stderr)
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go test -bench %s: %w", f, err)
		}
	}
	if rawPath != "" {
		if err := os.WriteFile(rawPath, out.Bytes(), 0o644); err != nil {
			return err
		}
	}
	res := parse(bytes.NewReader(out.Bytes()))
	if len(res) == 0 && len(instr) == 0 {
		return fmt.Errorf("no benchmark results in go test's output (is Redis reachable?)")
	}
	printReport(os.Stdout, res, instr, cpuModel(&out), time.Since(start), benchtime, count, rounds)
	return nil
}

// rotated are the benchmarks the Rotation family runs, each in a process
// of its own, in this order, round after round: the timed cases of the
// performance goals. In one process a benchmark's figure depends on what
// ran before it (the heap it left, the caches); in rotation, every
// implementation runs fresh and meets the machine's load in turn.
var rotated = []string{
	"^BenchmarkLocal$/^impl=hybridlimit-local$/^keys=100k$/^rules=1$/^procs=1$",
	"^BenchmarkLocal$/^impl=throttled-memory$/^keys=100k$/^rules=1$/^procs=1$",
	"^BenchmarkLocal$/^impl=sethvargo-memory$/^keys=100k$/^rules=1$/^procs=1$",
	"^BenchmarkLocal$/^impl=hybridlimit-local$/^keys=100k$/^rules=1$/^procs=2$",
	"^BenchmarkLocal$/^impl=throttled-memory$/^keys=100k$/^rules=1$/^procs=2$",
	"^BenchmarkLocal$/^impl=sethvargo-memory$/^keys=100k$/^rules=1$/^procs=2$",
	"^BenchmarkDistributed$/^impl=hybridlimit-sync$/^keys=1k$/^rules=1$/^goroutines=(64|256)$",
	"^BenchmarkDistributed$/^impl=redis-rate$/^keys=1k$/^rules=1$/^goroutines=(64|256)$",
	"^BenchmarkTakeScript$/^impl=take-script$/^keys=1k$/^rules=1$/^batch=512$/^inflight=1$",
	"^BenchmarkTakeScript$/^impl=take-script$/^keys=1k$/^rules=1$/^batch=512$/^inflight=2$",
}

// rotation builds bench's test binary and runs every benchmark of rotated
// in a process of its own, rounds times, appending their output to out
// with each family renamed Rotation<family>.
func rotation(dir, benchtime string, rounds int, out *bytes.Buffer) error {
	tmp, err := os.MkdirTemp("", "hybridlimit-report")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "bench.test")
	build := exec.Command("go", "test", "-c", "-o", bin, ".")
	build.Dir = dir
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	fmt.Fprintf(os.Stderr, "== go test -c (in %s), then %d rounds of %d benchmarks, each in its own process\n", dir, rounds, len(rotated))
	if err := build.Run(); err != nil {
		return fmt.Errorf("go test -c: %w", err)
	}
	for round := range rounds {
		for _, pattern := range rotated {
			cmd := exec.Command(bin, "-test.run", "^$", "-test.bench", pattern, "-test.benchmem", "-test.benchtime", benchtime)
			cmd.Dir = dir
			var buf bytes.Buffer
			cmd.Stdout, cmd.Stderr = &buf, os.Stderr
			if err := cmd.Run(); err != nil {
				os.Stderr.Write(buf.Bytes())
				return fmt.Errorf("round %d, %s: %w", round+1, pattern, err)
			}
			for _, line := range strings.SplitAfter(buf.String(), "\n") {
				if strings.HasPrefix(line, "cpu: ") && round == 0 {
					out.WriteString(line)
				}
				if strings.HasPrefix(line, "Benchmark") {
					line = "BenchmarkRotation" + strings.TrimPrefix(line, "Benchmark")
					out.WriteString(line)
					os.Stderr.WriteString(line)
				}
			}
		}
	}
	return nil
}

// instruction is one line of scripts/instructions.sh: a benchmark and
// its instructions per operation.
type instruction struct {
	bench string
	n     float64
}

// instructions runs scripts/instructions.sh (the repository root is
// benchDir's parent) and returns its counts.
func instructions(dir string) ([]instruction, error) {
	root, err := filepath.Abs(filepath.Join(dir, ".."))
	if err != nil {
		return nil, err
	}
	if dir == "." {
		if root, err = filepath.Abs(".."); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(os.Stderr, "== bash scripts/instructions.sh (in %s)\n", root)
	cmd := exec.Command("bash", "scripts/instructions.sh")
	cmd.Dir = root
	var buf bytes.Buffer
	cmd.Stdout = io.MultiWriter(&buf, os.Stderr)
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("scripts/instructions.sh: %w", err)
	}
	var res []instruction
	for _, line := range strings.Split(buf.String(), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if n, err := strconv.ParseFloat(f[1], 64); err == nil {
			res = append(res, instruction{f[0], n})
		}
	}
	return res, nil
}

// instr returns the count of the benchmark pattern b, or 0.
func instrOf(res []instruction, b string) float64 {
	for _, r := range res {
		if r.bench == b {
			return r.n
		}
	}
	return 0
}

// benchDir finds the bench module from the working directory.
func benchDir() (string, error) {
	for _, d := range []string{"bench", "."} {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && bytes.Contains(b, []byte("module github.com/hybridlimit/hybridlimit/bench\n")) {
			return d, nil
		}
	}
	return "", fmt.Errorf("run me from the hybridlimit repository root or from bench/")
}

// startRedis starts a throwaway redis-server and points the benchmarks at it.
func startRedis() (stop func(), err error) {
	path, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("HYBRIDLIMIT_REDIS_ADDR is unset and redis-server is not on $PATH: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	cmd := exec.Command(path, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--loglevel", "warning")
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for i := 0; ; i++ {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			_ = c.Close()
			break
		}
		if i == 50 {
			_ = cmd.Process.Kill()
			return nil, fmt.Errorf("redis-server did not start on %s", addr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	os.Setenv("HYBRIDLIMIT_REDIS_ADDR", addr)
	fmt.Fprintf(os.Stderr, "== started %s on %s\n", path, addr)
	return func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }, nil
}

// result is one benchmark's figures (the median over -count runs).
type result struct {
	family string            // Local, Distributed, ...
	impl   string            // the impl= parameter
	params map[string]string // the other parameters
	order  []string          // their names, in order
	m      map[string]float64
}

func (r *result) key() string {
	var b strings.Builder
	for _, k := range r.order {
		fmt.Fprintf(&b, "%s=%s/", k, r.params[k])
	}
	return b.String()
}

// parse reads go test -bench output, for example
//
//	BenchmarkLocal/impl=x/keys=1/rules=1/procs=1-2  100  85.2 ns/op  0 B/op  0 allocs/op
func parse(r io.Reader) []*result {
	byName := map[string]*result{}
	samples := map[string]map[string][]float64{}
	var names []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || !strings.Contains(f[0], "/impl=") {
			continue
		}
		name := f[0]
		if i := strings.LastIndexByte(name, '-'); i > strings.LastIndexByte(name, '/') {
			name = name[:i] // drop the GOMAXPROCS suffix
		}
		parts := strings.Split(name, "/")
		if _, ok := byName[name]; !ok {
			res := &result{family: strings.TrimPrefix(parts[0], "Benchmark"), params: map[string]string{}, m: map[string]float64{}}
			for _, p := range parts[1:] {
				k, v, _ := strings.Cut(p, "=")
				if k == "impl" {
					res.impl = v
					continue
				}
				res.params[k] = v
				res.order = append(res.order, k)
			}
			byName[name] = res
			samples[name] = map[string][]float64{}
			names = append(names, name)
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err == nil {
				samples[name][f[i+1]] = append(samples[name][f[i+1]], v)
			}
		}
	}
	var out []*result
	for _, n := range names {
		for unit, vs := range samples[n] {
			byName[n].m[unit] = median(vs)
		}
		out = append(out, byName[n])
	}
	return out
}

func median(vs []float64) float64 {
	s := slices.Clone(vs)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func cpuModel(out *bytes.Buffer) string {
	for _, line := range strings.Split(out.String(), "\n") {
		if s, ok := strings.CutPrefix(line, "cpu: "); ok {
			return strings.TrimSpace(s)
		}
	}
	return "unknown CPU"
}

// find returns the result of impl in the same case as r (same parameters).
func find(res []*result, family, impl, key string) *result {
	for _, r := range res {
		if r.family == family && r.impl == impl && r.key() == key {
			return r
		}
	}
	return nil
}

// findP returns the result of impl in family with the given parameters.
func findP(res []*result, family, impl string, params ...string) *result {
	for _, r := range res {
		if r.family != family || r.impl != impl {
			continue
		}
		ok := true
		for i := 0; i+1 < len(params); i += 2 {
			ok = ok && r.params[params[i]] == params[i+1]
		}
		if ok {
			return r
		}
	}
	return nil
}

// all returns every result of impl in family, in the order run.
func all(res []*result, family, impl string) []*result {
	var out []*result
	for _, r := range res {
		if r.family == family && r.impl == impl {
			out = append(out, r)
		}
	}
	return out
}

// ceiling returns the take script's fastest variant in family (the least
// ns/op, by median): the synchronous mode keeps up to two batches on their
// way, so the script driven one call at a time is not its ceiling when
// two calls at once go faster.
func ceiling(res []*result, family string) *result {
	var best *result
	for _, r := range all(res, family, "take-script") {
		if ns := r.m["ns/op"]; ns > 0 && (best == nil || ns < best.m["ns/op"]) {
			best = r
		}
	}
	return best
}

// inflight returns the take script's calls on their way at once in r
// (1 for the results of before the parameter).
func inflight(r *result) string {
	if v := r.params["inflight"]; v != "" {
		return v
	}
	return "1"
}

func ratio(a, b float64) string {
	if a == 0 || b == 0 {
		return "–"
	}
	x := a / b
	switch {
	case x >= 100:
		return fmt.Sprintf("%.0f×", x)
	case x >= 10:
		return fmt.Sprintf("%.1f×", x)
	}
	return fmt.Sprintf("%.2f×", x)
}

func num(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case v > 0 && v < 0.01:
		return strconv.FormatFloat(v, 'g', 2, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

func si(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.0fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

func printReport(w io.Writer, res []*result, instr []instruction, cpu string, took time.Duration, benchtime string, count, rounds int) {
	fmt.Fprintf(w, "Measured on %s, %d cores (GOMAXPROCS %d), %s/%s, %s; Redis on loopback. "+
		"go test -benchtime %s -count %d (median; the rotation: %d rounds), the whole run took %s.\n\n",
		cpu, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, runtime.Version(),
		benchtime, count, rounds, took.Round(time.Second))
	families := map[string]bool{}
	for _, r := range res {
		families[r.family] = true
	}
	if families["Local"] {
		fmt.Fprintln(w, "### Local decisions (warm keys, every decision admitted)")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Ratio: the implementation's ns/op divided by hybridlimit's in the same row group (above 1: hybridlimit is faster). Peers enforce three rules by chaining one limiter per rule.")
		fmt.Fprintln(w)
		table(w, res, "Local", []string{"hybridlimit-local", "hybridlimit-async"}, []string{"denied/op"})
	}
	if families["Distributed"] {
		fmt.Fprintln(w, "### Distributed decisions (one Redis, 1000 keys, one rule)")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "ns/op is wall time per decision with all goroutines deciding at once (decisions/s = 10⁹ ÷ ns/op). hybridlimit-async decides locally; its sync loop's load on Redis is redis-cmds/op and round-trips/op.")
		fmt.Fprintln(w)
		table(w, res, "Distributed", []string{"hybridlimit-async", "hybridlimit-sync"}, []string{"denied/op", "degraded/op", "redis-cmds/op", "round-trips/op", "client-cpu-ns/op", "server-cpu-ns/op"})
		for _, c := range all(res, "TakeScript", "take-script") {
			fmt.Fprintf(w, "The take script alone (%s goroutine(s) calling the Redis store's Take with pre-built batches of 512 requests, each one call at a time): "+
				"%s ns/op (%s decisions/s), %s ns of client CPU and %s ns of server CPU per decision.\n\n",
				inflight(c), num(c.m["ns/op"]), si(1e9/c.m["ns/op"]), num(c.m["client-cpu-ns/op"]), num(c.m["server-cpu-ns/op"]))
		}
	}
	if families["Sync"] {
		fmt.Fprintln(w, "### Sync throughput (one node, one rule, every key touched since the last cycle)")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "One op is one sync cycle over all the keys (push the increments, pull the merged totals). Ratio: hybridlimit's keys/s divided by the implementation's.")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| keys | impl | ms/cycle | keys/s | server CPU ns/key | client CPU ns/key | allocs/op | hybridlimit ÷ impl |")
		fmt.Fprintln(w, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
		for _, r := range res {
			if r.family != "Sync" {
				continue
			}
			h := find(res, "Sync", "hybridlimit-async", r.key())
			hv := 0.0
			if h != nil {
				hv = h.m["keys/s"]
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", r.params["keys"], r.impl, num(r.m["ns/op"]/1e6),
				si(r.m["keys/s"]), num(r.m["server-cpu-ns/key"]), num(r.m["client-cpu-ns/key"]), si(r.m["allocs/op"]), ratio(hv, r.m["keys/s"]))
		}
		fmt.Fprintln(w)
	}
	if families["Memory"] {
		fmt.Fprintln(w, "### Memory per tracked key (1M keys, one rule)")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Live heap after a GC, filled limiter minus empty process, per key; the key strings themselves are not counted unless the limiter copies them. Ratio: the implementation's B/key divided by hybridlimit-local's.")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| impl | B/key | fill time | × hybridlimit-local |")
		fmt.Fprintln(w, "| --- | ---: | ---: | ---: |")
		for _, r := range res {
			if r.family != "Memory" {
				continue
			}
			h := find(res, "Memory", "hybridlimit-local", r.key())
			hv := 0.0
			if h != nil {
				hv = h.m["B/key"]
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s |\n", r.impl, num(r.m["B/key"]),
				time.Duration(r.m["ns/op"]).Round(time.Millisecond), ratio(r.m["B/key"], hv))
		}
		fmt.Fprintln(w)
	}
	if len(instr) > 0 {
		fmt.Fprintln(w, "### Instructions per operation (callgrind, scripts/instructions.sh)")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Counted, not timed: repeatable on a loaded machine. Decision: one warm decision on one key from one goroutine; Floor: an xsync map load plus one atomic add, in the same loop.")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| benchmark | instructions/op | × Floor |")
		fmt.Fprintln(w, "| --- | ---: | ---: |")
		floor := instrOf(instr, "Floor$")
		for _, r := range instr {
			fmt.Fprintf(w, "| `%s` | %.1f | %s |\n", r.bench, r.n, ratio(r.n, floor))
		}
		fmt.Fprintln(w)
	}
	if families["RotationLocal"] || families["RotationDistributed"] || families["RotationTakeScript"] {
		fmt.Fprintf(w, "### The goals' timed cases in rotation (median of %d rounds)\n\n", rounds)
		fmt.Fprintln(w, "Each benchmark in a process of its own, the implementations one after the other, round after round (-benchtime as above): "+
			"no figure depends on what ran before it in its process, and each meets the machine's load in turn. The goals below read these rows.")
		fmt.Fprintln(w)
		table(w, res, "RotationLocal", []string{"hybridlimit-local"}, nil)
		table(w, res, "RotationDistributed", []string{"hybridlimit-sync"}, []string{"degraded/op", "round-trips/op", "client-cpu-ns/op", "server-cpu-ns/op"})
		for _, c := range all(res, "RotationTakeScript", "take-script") {
			fmt.Fprintf(w, "The take script alone, %s call(s) on their way at once: %s ns/op (%s decisions/s), %s ns of client CPU and %s ns of server CPU per decision.\n\n",
				inflight(c), num(c.m["ns/op"]), si(1e9/c.m["ns/op"]), num(c.m["client-cpu-ns/op"]), num(c.m["server-cpu-ns/op"]))
		}
	}
	goals(w, res, instr, rounds)
}

// source returns the family whose results the goals read for family: its
// rotation when the run has one (see rotated), else family itself; and
// how the goals table names it.
func source(res []*result, family string, rounds int) (string, string) {
	for _, r := range res {
		if r.family == "Rotation"+family {
			if rounds == 1 {
				return r.family, " (rotation, one round)"
			}
			return r.family, fmt.Sprintf(" (rotation, median of %d rounds)", rounds)
		}
	}
	return family, ""
}

// table prints one family: a row per result, grouped by case, with the ratio
// to each hybridlimit reference present in the case.
func table(w io.Writer, res []*result, family string, refs, extra []string) {
	var first *result
	for _, r := range res {
		if r.family == family {
			first = r
			break
		}
	}
	if first == nil {
		return
	}
	head := append(slices.Clone(first.order), "impl", "ns/op", "allocs/op", "B/op")
	head = append(head, extra...)
	for _, ref := range refs {
		head = append(head, "× "+ref)
	}
	fmt.Fprintln(w, "| "+strings.Join(head, " | ")+" |")
	align := make([]string, len(head))
	for i := range align {
		align[i] = "---:"
		if i <= len(first.order) {
			align[i] = "---"
		}
	}
	fmt.Fprintln(w, "| "+strings.Join(align, " | ")+" |")
	// Order rows by case (first seen), then implementation (as run).
	var cases []string
	rows := map[string][]*result{}
	for _, r := range res {
		if r.family != family {
			continue
		}
		k := r.key()
		if _, ok := rows[k]; !ok {
			cases = append(cases, k)
		}
		rows[k] = append(rows[k], r)
	}
	for _, k := range cases {
		for _, r := range rows[k] {
			var cells []string
			for _, p := range r.order {
				cells = append(cells, r.params[p])
			}
			cells = append(cells, r.impl, num(r.m["ns/op"]), num(r.m["allocs/op"]), num(r.m["B/op"]))
			for _, e := range extra {
				if v, ok := r.m[e]; ok {
					cells = append(cells, num(v))
				} else {
					cells = append(cells, "")
				}
			}
			for _, ref := range refs {
				h := find(res, family, ref, k)
				if h == nil || h == r {
					cells = append(cells, "")
					continue
				}
				cells = append(cells, ratio(r.m["ns/op"], h.m["ns/op"]))
			}
			fmt.Fprintln(w, "| "+strings.Join(cells, " | ")+" |")
		}
	}
	fmt.Fprintln(w)
}

// goals checks the project's performance goals against this run.
func goals(w io.Writer, res []*result, instr []instruction, rounds int) {
	fmt.Fprintln(w, "### Performance goals")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| goal | measured | met |")
	fmt.Fprintln(w, "| --- | --- | --- |")
	row := func(goal, measured string, ok bool) {
		m := "yes"
		if !ok {
			m = "**no**"
		}
		fmt.Fprintf(w, "| %s | %s | %s |\n", goal, measured, m)
	}
	if one, floor := instrOf(instr, "Decision/mode=local/rules=1$"), instrOf(instr, "Floor$"); one > 0 && floor > 0 {
		row("warm decision, 1 rule: ≤ 330 instructions and ≤ 2× the floor's",
			fmt.Sprintf("%.1f instructions, floor %.1f: %.2f×", one, floor, one/floor), one <= 330 && one <= 2*floor)
		if four := instrOf(instr, "Decision/mode=local/rules=4$"); four > 0 {
			row("4 rules ≤ 2× the 1-rule decision", fmt.Sprintf("%.1f vs %.1f instructions: %.2f×", four, one, four/one), four <= 2*one)
		}
	}
	local, how := source(res, "Local", rounds)
	for _, procs := range []string{"1", "2"} {
		h := findP(res, local, "hybridlimit-local", "keys", "100k", "rules", "1", "procs", procs)
		t := findP(res, local, "throttled-memory", "keys", "100k", "rules", "1", "procs", procs)
		sv := findP(res, local, "sethvargo-memory", "keys", "100k", "rules", "1", "procs", procs)
		if h != nil && t != nil && sv != nil {
			hn, tn, sn := h.m["ns/op"], t.m["ns/op"], sv.m["ns/op"]
			row("100k uniform keys, "+procs+" procs: ≤ 0.8× throttled and ≤ 1.0× sethvargo",
				fmt.Sprintf("%s ns vs throttled %s (%.2f×), sethvargo %s (%.2f×)%s", num(hn), num(tn), hn/tn, num(sn), hn/sn, how),
				hn <= 0.8*tn && hn <= sn)
		}
	}
	if l, a := findP(res, "Memory", "hybridlimit-local"), findP(res, "Memory", "hybridlimit-async"); l != nil && a != nil {
		lb, ab := l.m["B/key"], a.m["B/key"]
		row("memory per key, 1 rule, 1M keys: ≤ 128 B local", fmt.Sprintf("%s B", num(lb)), lb <= 128)
		row("memory per key, async ≤ local + 64 B (filled, before its first sync; after syncs: go test -bench MemoryPerKey in the root module)", fmt.Sprintf("%s B (local + %s)", num(ab), num(ab-lb)), ab <= lb+64)
	}
	if h := findP(res, "Sync", "hybridlimit-async", "keys", "100k"); h != nil {
		hv := h.m["keys/s"]
		best, bestImpl := 0.0, ""
		for _, r := range res {
			if r.family == "Sync" && r.impl != "hybridlimit-async" && r.params["keys"] == "100k" && r.m["keys/s"] > best {
				best, bestImpl = r.m["keys/s"], r.impl
			}
		}
		if best > 0 {
			row("sync, 100k keys: ≥ 1M keys/s or ≥ 0.9× the best command shape",
				fmt.Sprintf("%s keys/s vs %s %s: %.2f×", si(hv), bestImpl, si(best), hv/best), hv >= 1e6 || hv >= 0.9*best)
		}
	}
	dist, how := source(res, "Distributed", rounds)
	take, _ := source(res, "TakeScript", rounds)
	for _, g := range []string{"64", "256"} {
		s := findP(res, dist, "hybridlimit-sync", "goroutines", g)
		r := findP(res, dist, "redis-rate", "goroutines", g)
		if s != nil && r != nil {
			row("synchronous ≥ 4× redis_rate decisions/s, "+g+" goroutines",
				fmt.Sprintf("%s vs %s decisions/s: %.2f×%s", si(1e9/s.m["ns/op"]), si(1e9/r.m["ns/op"]), r.m["ns/op"]/s.m["ns/op"], how),
				4*s.m["ns/op"] <= r.m["ns/op"])
		}
		if c := ceiling(res, take); s != nil && c != nil {
			row("synchronous ≥ 0.8× the take script alone, "+g+" goroutines",
				fmt.Sprintf("%s vs %s decisions/s (%s in flight): %.2f×%s", si(1e9/s.m["ns/op"]), si(1e9/c.m["ns/op"]), inflight(c), c.m["ns/op"]/s.m["ns/op"], how),
				s.m["ns/op"] <= c.m["ns/op"]/0.8)
		}
	}
	if async := findP(res, "Local", "hybridlimit-async", "keys", "1", "rules", "1", "procs", "1"); async != nil {
		row("async decision allocates nothing", fmt.Sprintf("%s allocs/op", num(async.m["allocs/op"])), async.m["allocs/op"] == 0)
	}
	fmt.Fprintln(w)
}
