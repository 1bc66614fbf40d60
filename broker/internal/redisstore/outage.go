package redisstore

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// OutageHook is a go-redis hook that turns every failure meaning "Redis is
// not answering" into a *fleet.UnavailableError (Part fleet.PartRedis)
// wrapping the client's error, so that every store on the client (this
// package's, the agents' agentstore, the web sessions) reports an outage
// in one shape and the HTTP layer answers 503 with Retry-After instead of
// 500. Add it once to each client, in the composition root:
//
//	rdb.AddHook(redisstore.OutageHook{})
//
// An outage is: no connection (refused, reset, closed, EOF), a network
// timeout or a context deadline (Redis did not answer in time), a
// connection pool that stays exhausted, and the replies by which Redis
// says it cannot serve now (LOADING, READONLY and MASTERDOWN during a
// failover, CLUSTERDOWN, TRYAGAIN, NOREPLICAS). redis.Nil, script errors
// and a cancelled context (the caller went away) are left as they are.
type OutageHook struct{}

var _ redis.Hook = OutageHook{}

// DialHook passes dials through; their failures reach ProcessHook.
func (OutageHook) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook classifies the error of one command.
func (OutageHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return outage(next(ctx, cmd))
	}
}

// ProcessPipelineHook classifies the error of a pipeline and of each of its
// commands.
func (OutageHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if e := c.Err(); e != nil {
				if o := outage(e); o != e {
					c.SetErr(o)
				}
			}
		}
		return outage(err)
	}
}

// outageReplies are the prefixes of Redis error replies that mean "not
// now" rather than "not so".
var outageReplies = []string{"LOADING", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "NOREPLICAS"}

// outage returns err as a *fleet.UnavailableError when it means that
// Redis is not answering, else err itself.
func outage(err error) error {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) {
		return err
	}
	var ue *fleet.UnavailableError
	if errors.As(err, &ue) {
		return err
	}
	var ne net.Error
	down := errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrClosed)
	var re redis.Error
	if !down && errors.As(err, &re) {
		msg := re.Error()
		for _, p := range outageReplies {
			if strings.HasPrefix(msg, p) {
				down = true
				break
			}
		}
	}
	if !down {
		return err
	}
	return &fleet.UnavailableError{Part: fleet.PartRedis, Err: err}
}
