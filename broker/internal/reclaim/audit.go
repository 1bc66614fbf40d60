package reclaim

import (
	"strconv"
	"strings"
	"time"
)

// AuditEntry is one audited action.
type AuditEntry struct {
	// ID is the Redis stream id (set when read).
	ID            string            `json:"-"`
	Time          time.Time         `json:"time"`
	Actor         string            `json:"actor"`
	Action        string            `json:"action"`
	Target        string            `json:"target"`
	Reason        string            `json:"reason,omitempty"`
	PolicyVersion int64             `json:"policyVersion,omitempty"`
	Inputs        map[string]string `json:"inputs,omitempty"`
}

// Audit actions and targets written by this file.
const (
	AuditPolicyUpdate = "reclaim-policy.update"
	AuditTargetPolicy = "reclaim-policy"
)

// AuditQuery filters the audit log; empty fields match everything.
type AuditQuery struct {
	// Actor, Action and Target match exactly (Actor ignoring case).
	Actor, Action, Target string
	// Before is a cursor: only entries older than this id.
	Before string
	// Limit is the page size, 1..200; 0 means 50.
	Limit int
}

// ValidBefore reports whether s is usable as an audit cursor (a stream id).
func ValidBefore(s string) bool {
	ms, seq, ok := strings.Cut(s, "-")
	if !ok {
		return false
	}
	_, err1 := strconv.ParseUint(ms, 10, 64)
	_, err2 := strconv.ParseUint(seq, 10, 64)
	return err1 == nil && err2 == nil
}
