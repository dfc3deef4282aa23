// Package grpclimit is a gRPC server interceptor for a hybridlimit.Limiter.
// It keys each call (peer IP, a metadata value such as an API key, the full
// method name, or a combination), decides it with the limiter, fails denied
// calls with codes.ResourceExhausted, and reports the limiter's state in
// response metadata, with the same fields and values as package httplimit's
// HTTP headers.
//
//	key, err := grpclimit.PeerIP(grpclimit.IPOptions{})
//	if err != nil { ... }
//	lim, err := grpclimit.New(limiter, key, grpclimit.Options{})
//	if err != nil { ... }
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(lim.Unary),
//		grpc.ChainStreamInterceptor(lim.Stream))
//
// # Denials
//
// A denied call fails with codes.ResourceExhausted before its handler runs.
// The status message names the rule that denied it (its limit and window)
// and the status carries a google.rpc.RetryInfo detail whose retry_delay is
// Result.RetryAfter rounded up to the millisecond (plus Options.RetryJitter),
// and, with Options.QuotaFailure, a google.rpc.QuotaFailure detail with one
// violation per rule the call exceeds. Clients read them with
// status.FromError and Status.Details.
//
// # Metadata
//
// Every decided call gets these metadata fields (lower-case keys, as gRPC
// requires; the values are those httplimit writes in its headers):
//
//	ratelimit-policy     one Item per rule: "<name>";q=<quota>;w=<window s> (httplimit.Quota: a bucket rule's burst)
//	ratelimit            one Item per rule: "<name>";r=<remaining>;t=<s until the rule resets>
//	ratelimit-limit      the tightest rule's limit (on a denial, the denying rule's)
//	ratelimit-remaining  that rule's remaining quota
//	ratelimit-reset      seconds until that rule resets
//	retry-after          on a denial only: seconds to wait, rounded up
//
// The first two follow draft-ietf-httpapi-ratelimit-headers (see
// httplimit.Policy); Options.HideDraftMetadata and HideLegacyMetadata drop
// either group.
//
// An admitted call gets them as response headers, set with grpc.SetHeader
// before its handler runs: headers reach the client first, with the first
// response message of a stream, so a streaming client sees them at once,
// and the handler can still add its own headers, which are merged with
// these. A denied call gets them as trailers, with retry-after: the
// trailers carry the call's status and its details, so a client finds
// everything about the denial in one place (grpc.Trailer, or
// ClientStream.Trailer, next to status.FromError), and a message denied in
// the middle of a stream, after its headers went out, can only be reported
// in trailers: both denials read alike.
//
// # Streams
//
// A stream is decided once, when it opens, before its handler runs: a
// stream that lasts an hour costs what a unary call costs, unless
// Options.MessageCost also decides every message the server receives on a
// client-streaming or bidirectional stream. A message denied that way makes
// RecvMsg return the denial's status error, with the metadata as trailers;
// a handler that returns that error ends the stream with it.
//
// # Errors
//
// A call whose key cannot be computed, or that the limiter refuses (an
// empty or oversized key, a cost out of range, a closed limiter), fails
// with the error of Options.ErrorHandler: by default codes.InvalidArgument,
// or codes.Unavailable for a closed limiter (see DefaultErrorHandler).
// Store failures never become errors: the limiter's FailurePolicy decides
// them, and Result.Degraded reports it.
//
// Options.Shadow decides and reports every call but never fails one, to
// roll out limits; Options.OnDenied observes every denial.
package grpclimit
