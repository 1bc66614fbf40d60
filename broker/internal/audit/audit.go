// Package audit is the audit log's domain (ARCHITECTURE.md invariant 6):
// the record every audited action writes, the query that pages through the
// log, and its cursor. It imports no infrastructure; the log itself is
// broker/internal/redisstore.AuditLog, which merges the broker's own
// entries with the node agents' enforcement records into one view.
//
// The record (Entry, the wire type v1.AuditEntry) names its Source (the
// part whose log holds it), the Actor and its kind (user, admin, hub,
// reclaimer, agent), the Action, the Target, the Reason, the policy
// version and the decision's Inputs, so that every lifecycle action
// (create, stop, remove, resize, extend; by a user, the hub, an admin, the
// reclaimer or an agent) can be recorded in the same store.
package audit

import (
	"strconv"
	"strings"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// Entry is one audited action: the wire type itself, which is also the
// stored form of the broker's entries.
type Entry = v1.AuditEntry

// Actor is who does an audited action.
type Actor struct {
	// Name is the user name, "jupyterhub", "reclaimer" or
	// "gpubroker-agent@<node>".
	Name string
	// Kind is v1.ActorUser, ActorAdmin, ActorHub, ActorReclaimer or
	// ActorAgent.
	Kind string
}

// Query filters and pages the audit log; empty fields match everything.
type Query struct {
	// Source is v1.AuditSourceReclaim or v1.AuditSourceAgent.
	Source string
	// Actor, Action and Target match exactly (Actor ignoring case).
	Actor, Action, Target string
	// User matches entries about the servers of this user (target
	// ServerTarget(User, …)); with Server, about that one server.
	User, Server string
	// Before is the cursor of a previous page's Next: only older entries.
	Before string
	// Limit is the page size, 1..200; 0 means 50.
	Limit int
}

// Sources are the sources a Query may name.
var Sources = []string{v1.AuditSourceServers, v1.AuditSourceReclaim, v1.AuditSourceAgent}

// ServerTarget is the target of every entry about one server:
// "server:<user>/<name>" (names never hold '/').
func ServerTarget(user, name string) string { return "server:" + user + "/" + name }

// Matches reports whether e passes q's filters (not the cursor).
func (q Query) Matches(e Entry) bool {
	return (q.Source == "" || q.Source == e.Source) && (q.Actor == "" || strings.EqualFold(q.Actor, e.Actor)) &&
		(q.Action == "" || q.Action == e.Action) && (q.Target == "" || q.Target == e.Target) &&
		(q.User == "" || q.Server != "" || strings.HasPrefix(e.Target, ServerTarget(q.User, ""))) &&
		(q.Server == "" || e.Target == ServerTarget(q.User, q.Server))
}

// Cursor is a position in the merged log: for each source, the id of the
// newest entry not to return again ("" = from the newest). Its text form
// is "<reclaim id>,<agent id>", each side an id or "+" for from the newest.
type Cursor struct {
	Reclaim, Agent string
}

// String is the cursor's text form.
func (c Cursor) String() string {
	side := func(s string) string {
		if s == "" {
			return "+"
		}
		return s
	}
	return side(c.Reclaim) + "," + side(c.Agent)
}

// ParseCursor reads a cursor: "<id>,<id>" as String writes it, or a single
// stream id, which stands for that position in every source. ok is false
// for anything else.
func ParseCursor(s string) (c Cursor, ok bool) {
	a, b, two := strings.Cut(s, ",")
	if !two {
		if !ValidID(s) {
			return Cursor{}, false
		}
		return Cursor{Reclaim: s, Agent: s}, true
	}
	side := func(x string) (string, bool) {
		if x == "+" {
			return "", true
		}
		return x, ValidID(x)
	}
	var ok1, ok2 bool
	c.Reclaim, ok1 = side(a)
	c.Agent, ok2 = side(b)
	return c, ok1 && ok2
}

// ValidID reports whether s is a stream id, "<ms>-<seq>".
func ValidID(s string) bool {
	ms, seq, ok := strings.Cut(s, "-")
	if !ok {
		return false
	}
	_, err1 := strconv.ParseUint(ms, 10, 64)
	_, err2 := strconv.ParseUint(seq, 10, 64)
	return err1 == nil && err2 == nil
}

// Less reports whether stream id a is older than b (both ValidID).
func Less(a, b string) bool {
	am, as, _ := strings.Cut(a, "-")
	bm, bs, _ := strings.Cut(b, "-")
	an, _ := strconv.ParseUint(am, 10, 64)
	bn, _ := strconv.ParseUint(bm, 10, 64)
	if an != bn {
		return an < bn
	}
	aq, _ := strconv.ParseUint(as, 10, 64)
	bq, _ := strconv.ParseUint(bs, 10, 64)
	return aq < bq
}
