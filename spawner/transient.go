package spawner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
)

// DefaultRetryFor bounds how long one spawner operation retries answers of
// an API server that is not ready (see Transient), when the caller's
// context allows that long.
const DefaultRetryFor = 10 * time.Second

// retryBackoff is the wait between two tries of an operation that met a
// transient error: 100 ms doubling to 2 s, then 2 s on until the retries'
// time is up (Client.retry), ±20% jitter (client-go's own
// controllers back off from 5-10 ms to about 1-1000 s; an API server
// restart takes seconds, so this is bounded far lower).
var retryBackoff = wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 1 << 20, Cap: 2 * time.Second}

// Transient reports whether err says the API server could not take the
// request now rather than that it refused it: no answer at all (a
// connection refused, reset or cut short, a timeout), 429, 500, 503, 504,
// a server timeout, and a 403 of the authorizer (RBAC denies everything
// for a moment after an API server restart, until its informers have
// synced). A 403 of admission (a ResourceQuota, PodSecurity) is not
// transient, nor is a cancelled context.
func Transient(err error) bool {
	var status apierrors.APIStatus
	var ne net.Error
	switch {
	case err == nil || errors.Is(err, context.Canceled):
		return false
	case apierrors.IsForbidden(err):
		return authzDenied(err)
	case errors.As(err, &status):
		return unavailable(err)
	}
	// No answer from the API server; the spawner's own errors (ErrPodGone,
	// ErrNotOwned...) are not network errors and are final.
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err) ||
		utilnet.IsHTTP2ConnectionLost(err) || errors.Is(err, context.DeadlineExceeded)
}

// authzDenied reports whether a 403 comes from the authorizer, whose
// message is `<kind> "<name>" is forbidden: User "<user>" cannot <verb>
// resource ...` (k8s.io/apiserver's forbidden responder), rather than from
// admission.
func authzDenied(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, `User "`) && strings.Contains(msg, " cannot ")
}

// retry runs op until it succeeds, fails for good (an error that is not
// Transient), ctx ends or c.retryFor has passed since the first try,
// backing off between tries (c.backoff). A transient error it gives up
// on wraps ErrUnavailable.
//
// The waits come from the backoff's DelayFunc, which stays at Cap once it
// gets there; wait.ExponentialBackoffWithContext would stop trying at the
// Cap instead (it zeroes Steps), after about 3 s of the 10 s allowed.
func (c *Client) retry(ctx context.Context, what string, op func(context.Context) error) error {
	err := op(ctx)
	if !Transient(err) {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, c.retryFor)
	defer cancel()
	tries := 1
	werr := c.backoff.DelayFunc().Until(rctx, false, true, func(ctx context.Context) (bool, error) {
		tries++
		err = op(ctx)
		return !Transient(err), nil
	})
	switch {
	case werr != nil && Transient(err):
		c.log.WarnContext(ctx, "the API server did not take the request", "op", what, "tries", tries, "err", err)
		return fmt.Errorf("%s: %w after %d tries: %w", what, ErrUnavailable, tries, err)
	case tries > 1 && err == nil:
		c.log.InfoContext(ctx, "the API server took the request after retries", "op", what, "tries", tries)
	}
	return err
}
