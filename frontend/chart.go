package frontend

import (
	"fmt"
	"html/template"
	"strings"
)

// Chart geometry, in SVG user units.
const (
	chartW, chartH           = 640, 240
	chartLeft, chartRight    = 48, 16
	chartTop, chartBottom    = 16, 32
	chartPlotW, chartPlotH   = chartW - chartLeft - chartRight, chartH - chartTop - chartBottom
	chartGridLines           = 4
	chartMinimumSamples      = 1
	chartLabelTimeLayout     = "15:04"
	chartDescribedTimeLayout = "15:04 UTC"
)

// Chart draws SM utilization (% of the GPU) and memory in use (% of the
// slice's memoryLimitMiB) over time as an accessible SVG: role="img" with a
// title and a description that says the ranges in words, a legend, and
// both lines on one 0–100 % axis. Samples must be oldest first; with none
// it returns "".
func Chart(samples []Sample, memoryLimitMiB int64) template.HTML {
	if len(samples) < chartMinimumSamples {
		return ""
	}
	t0, t1 := samples[0].Time, samples[len(samples)-1].Time
	span := t1.Sub(t0).Seconds()
	x := func(i int) float64 {
		if span <= 0 {
			return chartLeft + float64(chartPlotW)*float64(i)/float64(max(1, len(samples)-1))
		}
		return chartLeft + float64(chartPlotW)*samples[i].Time.Sub(t0).Seconds()/span
	}
	y := func(pct float64) float64 {
		pct = min(max(pct, 0), 100)
		return chartTop + float64(chartPlotH)*(1-pct/100)
	}
	var sm, mem strings.Builder
	maxSM, maxMem := 0.0, int64(0)
	for i, s := range samples {
		memPct := 0.0
		if memoryLimitMiB > 0 {
			memPct = 100 * float64(s.MemoryMiB) / float64(memoryLimitMiB)
		}
		fmt.Fprintf(&sm, "%.1f,%.1f ", x(i), y(s.SMPercent))
		fmt.Fprintf(&mem, "%.1f,%.1f ", x(i), y(memPct))
		maxSM = max(maxSM, s.SMPercent)
		maxMem = max(maxMem, s.MemoryMiB)
	}
	var b strings.Builder
	desc := fmt.Sprintf("%d samples from %s to %s. SM utilization peaked at %.0f %% of the GPU; memory in use peaked at %s of the slice's %s.",
		len(samples), t0.UTC().Format(chartDescribedTimeLayout), t1.UTC().Format(chartDescribedTimeLayout), maxSM, formatMiB(maxMem), formatMiB(memoryLimitMiB))
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" role="img" aria-labelledby="chart-title chart-desc" xmlns="http://www.w3.org/2000/svg">`, chartW, chartH)
	fmt.Fprintf(&b, `<title id="chart-title">GPU use over time</title><desc id="chart-desc">%s</desc>`, template.HTMLEscapeString(desc))
	for i := 0; i <= chartGridLines; i++ {
		pct := float64(100 * i / chartGridLines)
		fmt.Fprintf(&b, `<line class="grid" x1="%d" x2="%d" y1="%.1f" y2="%.1f"/>`, chartLeft, chartW-chartRight, y(pct), y(pct))
		fmt.Fprintf(&b, `<text class="axis" x="%d" y="%.1f" text-anchor="end">%.0f %%</text>`, chartLeft-6, y(pct)+4, pct)
	}
	fmt.Fprintf(&b, `<text class="axis" x="%d" y="%d">%s</text>`, chartLeft, chartH-8, t0.UTC().Format(chartLabelTimeLayout))
	fmt.Fprintf(&b, `<text class="axis" x="%d" y="%d" text-anchor="end">%s</text>`, chartW-chartRight, chartH-8, t1.UTC().Format(chartLabelTimeLayout))
	fmt.Fprintf(&b, `<polyline class="line-sm" points="%s"/>`, strings.TrimSpace(sm.String()))
	fmt.Fprintf(&b, `<polyline class="line-mem" points="%s"/>`, strings.TrimSpace(mem.String()))
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // built from numbers and escaped text only
}
