package servers

// What callers read about servers: one record, a user's list (whole or a
// page), quota use and a server's event stream.

import (
	"context"
	"time"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// Get returns one server; fleet.ErrNotFound if it never existed.
func (s *Service) Get(ctx context.Context, key fleet.ServerKey) (fleet.Server, error) {
	return s.store.GetServer(ctx, key)
}

// List returns a user's servers, or every server when user is "".
func (s *Service) List(ctx context.Context, user string) ([]fleet.Server, error) {
	return s.store.ListServers(ctx, user)
}

// ListPage returns up to limit (1..1000) servers of user, or of every user
// when user is "", ordered by user and name, after the cursor after (""
// = from the start), and the next page's cursor ("" on the last). A
// cursor this list did not return wraps fleet.ErrInvalid.
func (s *Service) ListPage(ctx context.Context, user, after string, limit int) ([]fleet.Server, string, error) {
	return s.store.ServersPage(ctx, user, after, limit)
}

// Quota returns the caps that apply to user in groups, each with what is
// in use under it: the user's own first, then each group that has a cap,
// by name.
func (s *Service) Quota(ctx context.Context, user string, groups []string) ([]fleet.QuotaUse, error) {
	uq, gq := s.catalog.Quotas().ForUser(user, groups)
	names := fleet.SortedGroups(gq)
	used, byGroup, err := s.store.QuotaUsed(ctx, user, names)
	if err != nil {
		return nil, err
	}
	out := []fleet.QuotaUse{{Scope: "user", Name: user, Limit: uq, Used: used}}
	for _, g := range names {
		out = append(out, fleet.QuotaUse{Scope: "group", Name: g, Limit: gq[g], Used: byGroup[g]})
	}
	return out, nil
}

// Events returns the server's events after afterID, waiting up to block
// for one when there are none yet. A server that does not exist wraps
// fleet.ErrNotFound. A wait that brings events answers without reading the
// record (a removed server's events go with it); one that brings none, and
// a read without waiting, check that the server is there.
func (s *Service) Events(ctx context.Context, key fleet.ServerKey, afterID string, block time.Duration) ([]fleet.Event, error) {
	if block > 0 {
		evs, err := s.store.Events(ctx, key, afterID, block)
		if err != nil || len(evs) > 0 {
			return evs, err
		}
	}
	if _, err := s.store.GetServer(ctx, key); err != nil {
		return nil, err
	}
	if block > 0 {
		return nil, nil
	}
	return s.store.Events(ctx, key, afterID, 0)
}
