package frontend_test

import (
	"strings"
	"testing"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// TestPagesShowSharingModes: the launch form says each profile's sharing
// in words, a MIG server's page refuses resize with the reason and offers
// the restart profiles, and a running server shows promised vs delivered.
func TestPagesShowSharingModes(t *testing.T) {
	a := baseAnswers()
	a["GET /api/v1/profiles"] = answer{200, []v1.Profile{
		{Name: "small", DisplayName: "Small", Sharing: v1.SharingSliced, SharingWords: "time-sliced slice",
			Slice: v1.Slice{MemoryMiB: 8192, ComputePercent: 10, ComputeLimitPercent: 50}},
		{Name: "mig3", DisplayName: "MIG 3g", Sharing: v1.SharingMIG, SharingWords: "MIG instance 3g.71gb", MIGProfile: "3g.71gb"},
		{Name: "mps", DisplayName: "MPS", Sharing: v1.SharingMPS, SharingWords: "MPS client",
			Slice: v1.Slice{MemoryMiB: 16384, ComputePercent: 30, ComputeLimitPercent: 30}},
	}}
	mig := running
	mig.Sharing, mig.Profile = v1.SharingMIG, "mig3"
	mig.Slice = v1.Slice{MemoryMiB: 72704, ComputePercent: 42, ComputeLimitPercent: 42}
	mig.GPU = &v1.GPURef{UUID: "MIG-1", Node: "node-a", Model: "NVIDIA H200", MIGProfile: "3g.71gb", ParentUUID: "GPU-1"}
	mig.Resize = v1.ResizeInfo{Reason: "a MIG instance has a fixed size: another MIG profile means a restart", RestartProfiles: []string{"mig1", "mig7"}}
	a["GET /api/v1/users/alice/servers/nb"] = answer{200, mig}
	sliced := running
	sliced.Name = "sl"
	sliced.Guarantee = &v1.Guarantee{Percent: 10, WindowSeconds: 3600, WantedSeconds: 1000, MetSeconds: 992}
	a["GET /api/v1/users/alice/servers/sl"] = answer{200, sliced}
	s := newSite(t, fakeSessions{v: alice}, a)

	form := s.do(t, "GET", "/servers", nil).Body.String()
	for _, want := range []string{
		`id="p-small">time-sliced slice · 8 GiB GPU memory · 10 % of the SMs guaranteed, up to 50 %</span>`,
		`id="p-mig3">MIG instance 3g.71gb</span>`,
		`id="p-mps">MPS client · 16 GiB GPU memory · 30 % of the SMs guaranteed</span>`,
	} {
		if !strings.Contains(form, want) {
			t.Errorf("launch form lacks %q", want)
		}
	}

	page := s.do(t, "GET", "/servers/nb", nil).Body.String()
	for _, want := range []string{
		"<dd>MIG instance 3g.71gb</dd>",
		"<p>a MIG instance has a fixed size: another MIG profile means a restart</p>",
		"start it again with another profile: <strong>mig1</strong>, <strong>mig7</strong>.",
		`<br>on GPU <code class="uuid" title="GPU-1">GPU-1</code>`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("MIG server's page lacks %q", want)
		}
	}
	if strings.Contains(page, "/resize") {
		t.Error("a MIG server's page offers the resize form")
	}

	page = s.do(t, "GET", "/servers/sl", nil).Body.String()
	if want := `<dd id="guarantee">It got its 10 % guarantee 99.2 % of the time it asked for it over the last hour.</dd>`; !strings.Contains(page, want) {
		t.Errorf("running server's page lacks %q", want)
	}
}
