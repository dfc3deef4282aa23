// Command example starts a rate-limited gRPC server on a loopback port and
// a client that calls it until it is denied, printing every answer: the
// rate-limit metadata of the admitted calls, then the denial's status,
// its RetryInfo and QuotaFailure details and its trailers.
//
//	go run ./grpclimit/example -limit 3 -window 10s
//
// The server serves grpc's own health service, which stands in for yours
// (a real server would rather exempt health checks with Options.Skip).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/grpclimit"
)

func main() {
	limit := flag.Int64("limit", 3, "calls admitted per window and peer")
	window := flag.Duration("window", 10*time.Second, "the window (a whole number of milliseconds)")
	flag.Parse()
	if err := run(os.Stdout, *limit, *window); err != nil {
		log.Fatal(err)
	}
}

// run starts the server, calls it until it denies a call, and stops it.
func run(w io.Writer, limit int64, window time.Duration) error {
	l, err := hybridlimit.New(hybridlimit.Config{Rules: []hybridlimit.Rule{{Limit: limit, Window: window}}})
	if err != nil {
		return err
	}
	defer l.Close(context.Background())
	key, err := grpclimit.PeerIP(grpclimit.IPOptions{})
	if err != nil {
		return err
	}
	lim, err := grpclimit.New(l, key, grpclimit.Options{QuotaFailure: true})
	if err != nil {
		return err
	}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(lim.Unary), grpc.ChainStreamInterceptor(lim.Stream))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	defer func() {
		srv.Stop()
		<-served
	}()
	fmt.Fprintf(w, "server on %s, %d calls per %v per peer\n", lis.Addr(), limit, window)

	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	return callUntilDenied(w, healthpb.NewHealthClient(cc), limit+1)
}

// callUntilDenied calls Check at most max times, until a call is denied.
func callUntilDenied(w io.Writer, client healthpb.HealthClient, max int64) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for n := int64(1); n <= max; n++ {
		var header, trailer metadata.MD
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header), grpc.Trailer(&trailer))
		if err == nil {
			fmt.Fprintf(w, "call %d: OK\n  headers:  %s\n", n, format(header))
			continue
		}
		st := status.Convert(err)
		if st.Code() != codes.ResourceExhausted {
			return err
		}
		fmt.Fprintf(w, "call %d: %v: %s\n", n, st.Code(), st.Message())
		for _, d := range st.Details() {
			switch d := d.(type) {
			case *errdetails.RetryInfo:
				fmt.Fprintf(w, "  RetryInfo: retry_delay %v\n", d.GetRetryDelay().AsDuration())
			case *errdetails.QuotaFailure:
				for _, v := range d.GetViolations() {
					fmt.Fprintf(w, "  QuotaFailure: %s: %s\n", v.GetSubject(), v.GetDescription())
				}
			}
		}
		fmt.Fprintf(w, "  trailers: %s\n", format(trailer))
		return nil
	}
	return errors.New("no call was denied")
}

// format prints the rate-limit fields of md on one line.
func format(md metadata.MD) string {
	var s string
	for _, k := range []string{"ratelimit-policy", "ratelimit", "ratelimit-limit", "ratelimit-remaining", "ratelimit-reset", "retry-after"} {
		if v := md.Get(k); len(v) > 0 {
			if s != "" {
				s += "  "
			}
			s += k + ": " + v[0]
		}
	}
	return s
}
