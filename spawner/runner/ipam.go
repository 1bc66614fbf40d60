package runner

import (
	"net/netip"
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// ipam hands out pod IPs of one range, one per pod UID, round robin so that
// a released address is reused as late as possible. Safe for concurrent use.
type ipam struct {
	prefix netip.Prefix

	mu    sync.Mutex
	next  netip.Addr
	inUse map[netip.Addr]types.UID
	byUID map[types.UID]netip.Addr
}

func newIPAM(p netip.Prefix) *ipam {
	p = p.Masked()
	return &ipam{prefix: p, next: p.Addr().Next(), inUse: map[netip.Addr]types.UID{}, byUID: map[types.UID]netip.Addr{}}
}

// get returns uid's address, allocating one; ok is false when the range is
// full.
func (a *ipam) get(uid types.UID) (netip.Addr, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ip, ok := a.byUID[uid]; ok {
		return ip, true
	}
	size := 1 << (32 - a.prefix.Bits())
	for range size {
		ip := a.next
		a.next = ip.Next()
		if !a.prefix.Contains(a.next) {
			a.next = a.prefix.Addr()
		}
		if ip == a.prefix.Addr() || !a.prefix.Contains(ip.Next()) { // network and broadcast
			continue
		}
		if _, used := a.inUse[ip]; !used {
			a.inUse[ip] = uid
			a.byUID[uid] = ip
			return ip, true
		}
	}
	return netip.Addr{}, false
}

// skip marks uid's current address as unusable for everyone (something
// outside the runner holds it) and forgets it for uid, whose next get takes
// another.
func (a *ipam) skip(uid types.UID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ip, ok := a.byUID[uid]; ok {
		delete(a.byUID, uid)
		a.inUse[ip] = "" // held by no pod; never handed out again
	}
}

// release frees uid's address, if it holds one.
func (a *ipam) release(uid types.UID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ip, ok := a.byUID[uid]; ok {
		delete(a.byUID, uid)
		delete(a.inUse, ip)
	}
}
