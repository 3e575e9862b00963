package web

import (
	"fmt"
	"strings"
	"time"

	"github.com/codexrelay/codex-relay/internal/store"
)

// Formatting for the console: short forms in cells, full forms in titles.

// span renders a duration in the two largest units that matter.
func span(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	switch {
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	case d < 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d < time.Minute:
		return fmt.Sprintf("%d s", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm %02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh %02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd %dh", int(d.Hours())/24, int(d.Hours())%24)
}

// ago is how long before now t was.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := now.Sub(t)
	if d < 2*time.Second {
		return "just now"
	}
	return span(d) + " ago"
}

// until is how long after now t is, or that it passed.
func until(now, t time.Time) string {
	if t.IsZero() {
		return ""
	}
	if !t.After(now) {
		return "passed " + span(now.Sub(t)) + " ago"
	}
	return "in " + span(t.Sub(now))
}

// stamp is a full UTC time, for titles and settings.
func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05 UTC")
}

// clock is a short time: the time of day today, else the date too.
func clock(now, t time.Time) string {
	t, now = t.UTC(), now.UTC()
	if t.YearDay() == now.YearDay() && t.Year() == now.Year() {
		return t.Format("15:04:05")
	}
	return t.Format("Jan 02 15:04")
}

// statusTone maps an account status to a tone.
func statusTone(st store.Status) string {
	switch st {
	case store.StatusActive:
		return "ok"
	case store.StatusRateLimited, store.StatusQuotaExceeded:
		return "warn"
	case store.StatusPaused:
		return "info"
	}
	return "bad"
}

// classTone maps an attempt class to a tone.
func classTone(class string) string {
	switch class {
	case "ok":
		return "ok"
	case "cancelled", "":
		return ""
	case "usage_limit", "rate_limit", "quota", "previous_response_not_found":
		return "warn"
	}
	return "bad"
}

// httpTone maps an HTTP status to a tone.
func httpTone(status int) string {
	switch {
	case status == 0:
		return ""
	case status < 400:
		return "ok"
	case status == 429 || status == 499:
		return "warn"
	}
	return "bad"
}

// usedTone maps a usage percentage to a tone.
func usedTone(pct float64) string {
	switch {
	case pct >= 90:
		return "bad"
	case pct >= 70:
		return "warn"
	}
	return "ok"
}

// windowLabel names a usage window by its length: 5h, 7d, 60m.
func windowLabel(minutes int, fallback string) string {
	switch {
	case minutes <= 0:
		return fallback
	case minutes%1440 == 0:
		return fmt.Sprintf("%dd", minutes/1440)
	case minutes%60 == 0:
		return fmt.Sprintf("%dh", minutes/60)
	}
	return fmt.Sprintf("%dm", minutes)
}

// auditTone maps an audit action to a tone.
func auditTone(action string) string {
	switch {
	case action == "login.failed":
		return "bad"
	case strings.HasSuffix(action, ".reset"), strings.HasSuffix(action, ".delete"), strings.HasSuffix(action, ".revoke"),
		strings.HasSuffix(action, ".pause"):
		return "warn"
	case strings.HasSuffix(action, ".pin"):
		return "pin"
	}
	return "info"
}

func clampPct(v float64) int {
	return int(min(max(v, 0), 100) + 0.5)
}
