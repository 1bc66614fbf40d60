package redisstore

import (
	"encoding/json"
	"fmt"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// allocRecord is the stored form of a fleet.Allocation, written by
// place.lua and restore.lua: its head (recordHead), the slice members,
// the device's ref (allocRef) and its sharing mode.
type allocRecord struct {
	allocHead
	MemoryMiB           int64  `json:"memoryMiB"`
	ComputePercent      int    `json:"computePercent"`
	ComputeLimitPercent int    `json:"computeLimitPercent"`
	GPU                 string `json:"gpu"`
	Node                string `json:"node"`
	Model               string `json:"model"`
	MIGProfile          string `json:"migProfile,omitempty"`
	Parent              string `json:"parent,omitempty"`
	Sharing             string `json:"sharing,omitempty"` // absent: before sharing modes (sliced)
}

// allocHead is the part of an allocRecord that the allocation itself
// gives; the rest depends on the device placement chose.
type allocHead struct {
	SliceID string   `json:"sliceId"`
	User    string   `json:"user"`
	Groups  []string `json:"groups"`
}

func decodeAlloc(raw string) (fleet.Allocation, error) {
	var r allocRecord
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		return fleet.Allocation{}, fmt.Errorf("decode allocation: %w", err)
	}
	a := fleet.Allocation{
		SliceID: r.SliceID,
		User:    r.User,
		Slice: fleet.Slice{
			MemoryMiB:           r.MemoryMiB,
			ComputePercent:      r.ComputePercent,
			ComputeLimitPercent: r.ComputeLimitPercent,
		},
		GPUUUID:    r.GPU,
		Node:       r.Node,
		Model:      r.Model,
		Sharing:    fleet.ModeOf(fleet.SharingMode(r.Sharing)),
		MIGProfile: r.MIGProfile,
		Parent:     r.Parent,
	}
	if len(r.Groups) > 0 {
		a.Groups = r.Groups
	}
	return a, nil
}

// The scripts store an allocation as recordHead(...) + the slice members
// (slice_members in lib.lua: whole devices are charged their own size,
// known only once chosen) + ref + the "sharing" member of the device's mode
// + "}", where ref names the device; together they are the JSON of
// allocRecord. Splitting it keeps JSON encoding of free text out of Lua:
// the device's ref is built here when it registers and stored in its hash;
// Lua writes only integers and mode names.

// recordHead returns the JSON of a's slice id, user and groups, without
// the closing brace and with a trailing comma.
func recordHead(a fleet.Allocation) (string, error) {
	groups := a.Groups
	if groups == nil {
		groups = []string{}
	}
	b, err := json.Marshal(allocHead{a.SliceID, a.User, groups})
	if err != nil {
		return "", fmt.Errorf("encode allocation: %w", err)
	}
	return string(b[:len(b)-1]) + ",", nil
}

// allocRef returns the JSON members "gpu":…,"node":…,"model":… (and for a
// MIG instance "migProfile":…,"parent":…) that follow the slice members of
// a record.
func allocRef(gpu, node, model, migProfile, parent string) (string, error) {
	b, err := json.Marshal(struct {
		GPU        string `json:"gpu"`
		Node       string `json:"node"`
		Model      string `json:"model"`
		MIGProfile string `json:"migProfile,omitempty"`
		Parent     string `json:"parent,omitempty"`
	}{gpu, node, model, migProfile, parent})
	if err != nil {
		return "", fmt.Errorf("encode gpu ref: %w", err)
	}
	return string(b[1 : len(b)-1]), nil
}
