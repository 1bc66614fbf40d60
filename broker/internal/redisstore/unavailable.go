package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// UnavailableHook is a go-redis hook that makes every error meaning "Redis
// did not answer" wrap fleet.ErrStoreUnavailable, so the API answers 503
// with Retry-After rather than 500 while Redis restarts or fails over. Those
// errors are: a connection refused, reset or cut short (EOF), a network
// timeout, a full connection pool, a closed client, and the replies
// LOADING (a restarted Redis still reading its data), MASTERDOWN and
// READONLY (a replica during failover), TRYAGAIN and CLUSTERDOWN. Every
// other error (redis.Nil, script errors, NOSCRIPT) is left as it is, so
// go-redis and the stores still see them. Add it to each client with
// AddHook before use (app.RedisClients does).
type UnavailableHook struct{}

var _ redis.Hook = UnavailableHook{}

// DialHook passes dials through; their errors reach ProcessHook.
func (UnavailableHook) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook wraps the command's error when it means Redis did not answer.
func (UnavailableHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if w := unavailable(err); w != err {
			cmd.SetErr(w)
			return w
		}
		return err
	}
}

// ProcessPipelineHook wraps each command's error, and the pipeline's, as
// ProcessHook does.
func (UnavailableHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if w := unavailable(c.Err()); w != c.Err() {
				c.SetErr(w)
			}
		}
		return unavailable(err)
	}
}

// unavailable returns err wrapped in fleet.ErrStoreUnavailable when it means
// Redis did not answer, else err itself.
func unavailable(err error) error {
	if err == nil || errors.Is(err, fleet.ErrStoreUnavailable) {
		return err
	}
	var ne net.Error
	switch {
	case errors.Is(err, redis.Nil):
		return err
	case errors.As(err, &ne), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrClosed):
	case redis.HasErrorPrefix(err, "LOADING"), redis.HasErrorPrefix(err, "MASTERDOWN"), redis.HasErrorPrefix(err, "READONLY"),
		redis.HasErrorPrefix(err, "TRYAGAIN"), redis.HasErrorPrefix(err, "CLUSTERDOWN"):
	default:
		return err
	}
	return fmt.Errorf("%w: %w", fleet.ErrStoreUnavailable, err)
}
