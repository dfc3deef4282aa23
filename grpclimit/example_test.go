package grpclimit_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"strings"
	"time"

	"github.com/benbjohnson/clock"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/grpclimit"
)

// Example limits a gRPC server to 2 calls per minute per API key (per peer
// IP for calls without one), and calls it until it denies. The health
// service stands in for your own; a mock clock keeps the printed delays
// stable.
func Example() {
	mc := clock.NewMock()
	mc.Set(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	l, err := hybridlimit.New(hybridlimit.Config{
		Rules: []hybridlimit.Rule{{Limit: 2, Window: time.Minute}},
		Clock: mc, // omit in production
	})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close(context.Background())

	peerIP, err := grpclimit.PeerIP(grpclimit.IPOptions{})
	if err != nil {
		log.Fatal(err)
	}
	apiKey, err := grpclimit.Metadata("x-api-key")
	if err != nil {
		log.Fatal(err)
	}
	lim, err := grpclimit.New(l, grpclimit.Or(apiKey, peerIP), grpclimit.Options{
		Skip: func(_ context.Context, method string) bool {
			return strings.HasPrefix(method, "/grpc.reflection.")
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(lim.Unary), grpc.ChainStreamInterceptor(lim.Stream))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	client := healthpb.NewHealthClient(cc)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "k-123")
	for n := 1; n <= 3; n++ {
		var header, trailer metadata.MD
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header), grpc.Trailer(&trailer))
		if err == nil {
			fmt.Printf("call %d: OK, ratelimit: %s\n", n, header.Get("ratelimit")[0])
			continue
		}
		st := status.Convert(err)
		fmt.Printf("call %d: %v: %s\n", n, st.Code(), st.Message())
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				fmt.Println("RetryInfo delay:", ri.GetRetryDelay().AsDuration())
			}
		}
		fmt.Println("retry-after:", trailer.Get("retry-after")[0])
	}
	// Output:
	// call 1: OK, ratelimit: "1m";r=1;t=120
	// call 2: OK, ratelimit: "1m";r=0;t=120
	// call 3: ResourceExhausted: grpclimit: rate limit exceeded: 2 per 1m (policy "1m"); retry after 1m30s
	// RetryInfo delay: 1m30s
	// retry-after: 90
}
