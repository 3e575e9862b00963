package web

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/relay"
	"github.com/codexrelay/codex-relay/web/ui"
)

func TestBuildOverview(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	accounts := []store.Account{
		{ID: "acc_a", Label: "alpha", Status: store.StatusActive},
		{ID: "acc_b", Label: "beta", Status: store.StatusRateLimited},
		{ID: "acc_c", Label: "gamma", Status: store.StatusPaused},
	}
	rows := []ui.AccountRow{{ID: "acc_a", InFlight: 2}, {ID: "acc_b", InFlight: 1}}
	// What the store counted for the hour (see store.TestTraffic): the
	// newest minute two requests and a switch, the one before a failed
	// request, one five minutes ago, one 59 minutes ago.
	perMinute := func(at map[int]int) []int {
		v := make([]int, 60)
		for i, n := range at {
			v[i] = n
		}
		return v
	}
	tr := store.Traffic{
		Requests:       perMinute(map[int]int{59: 2, 58: 1, 54: 1, 0: 1}),
		Failed:         perMinute(map[int]int{58: 1}),
		Switches:       perMinute(map[int]int{59: 1}),
		FailedAttempts: perMinute(map[int]int{59: 1, 58: 1, 0: 1}),
		Classes:        map[string]int{"usage_limit": 2, "transport": 1},
		Threads: []store.ThreadTraffic{
			{ThreadID: "t1", SessionID: "s1", AccountID: "acc_a", Requests: 3, Errors: 1, Switches: 1, LastAt: now.Add(-10 * time.Second)},
			{ThreadID: "t2", AccountID: "acc_gone", Requests: 1, LastAt: now.Add(-59 * time.Minute)},
		},
	}
	lanes := []relay.LaneInfo{{AccountID: "acc_a"}}
	o, err := buildOverview(now, accounts, rows, lanes, tr, 12, 2)
	require.NoError(t, err)

	cards := map[string]ui.Card{}
	for _, c := range o.Cards {
		cards[c.Label] = c
	}
	assert.Equal(t, "1 / 3", cards["Accounts available"].Value)
	assert.Equal(t, "warn", cards["Accounts available"].Tone)
	assert.Equal(t, "1 limited, 1 other", cards["Accounts available"].Note)
	assert.Equal(t, "5", cards["Requests"].Value)
	assert.Contains(t, cards["Requests"].Note, "1 failed")
	assert.Equal(t, "1", cards["Switches"].Value)
	assert.Equal(t, "3", cards["Failed attempts"].Value)
	assert.Equal(t, "bad", cards["Failed attempts"].Tone, "one request in five failed")
	assert.Equal(t, "3", cards["In flight"].Value)
	assert.Equal(t, "1", cards["Live lanes"].Value)
	assert.Equal(t, "12", cards["Bindings"].Value)
	assert.Equal(t, "2 pins", cards["Bindings"].Note)

	// The charts: a value per minute, oldest first, each minute named by
	// its UTC time; a value axis in whole requests or attempts per minute.
	require.Len(t, o.Charts, 2)
	traffic, failed := o.Charts[0], o.Charts[1]
	assert.Equal(t, "Requests per minute", traffic.Title)
	require.Len(t, traffic.Table.Rows, 60)
	assert.Equal(t, ui.ChartRow{Label: "12:00", Cells: []string{"2"}}, traffic.Table.Rows[59], "the newest minute: two requests")
	assert.Equal(t, ui.ChartRow{Label: "11:59", Cells: []string{"1"}}, traffic.Table.Rows[58])
	assert.Equal(t, ui.ChartRow{Label: "11:01", Cells: []string{"1"}}, traffic.Table.Rows[0], "59 minutes ago")
	assert.Equal(t, []string{"failed attempts", "switches"}, failed.Table.Head)
	assert.Equal(t, []string{"1", "1"}, failed.Table.Rows[59].Cells, "the newest minute: a failed attempt and a switch")
	assert.Equal(t, []string{"1", "0"}, failed.Table.Rows[0].Cells)
	for _, c := range o.Charts {
		for _, svg := range []string{c.SVG, c.NarrowSVG} {
			assert.Contains(t, svg, "<svg", c.ID)
			assert.Contains(t, svg, ">11:01</text>", "%s: the time axis starts at the window's first minute", c.ID)
			assert.Contains(t, svg, ">12:00</text>", "%s: and ends now", c.ID)
			assert.Contains(t, svg, ">4</text>", "%s: the value axis reaches a whole 4 above the peak of 2", c.ID)
			assert.Contains(t, svg, ">0</text>", c.ID)
		}
	}
	assert.Contains(t, traffic.SVG, ">requests / min</text>", "the value axis says its unit")
	assert.Contains(t, failed.SVG, ">attempts / min</text>")

	require.Len(t, o.Classes, 2)
	assert.Equal(t, ui.ClassCount{Class: "usage_limit", Count: 2, Width: 100, Tone: "warn", URL: "/admin/diagnostics?class=usage_limit"}, o.Classes[0])
	assert.Equal(t, 50, o.Classes[1].Width)

	require.Len(t, o.Threads, 2)
	assert.Equal(t, "t1", o.Threads[0].Thread)
	assert.Equal(t, 3, o.Threads[0].Requests)
	assert.Equal(t, 1, o.Threads[0].Switches)
	assert.Equal(t, 1, o.Threads[0].Errors)
	assert.Equal(t, "alpha", o.Threads[0].Account, "the account of its latest request")
	assert.Equal(t, "10 s ago", o.Threads[0].LastSeen)
	assert.Equal(t, "acc_gone", o.Threads[1].Account, "an account since removed shows by id")
	assert.Equal(t, "/admin/bindings?thread=t1", o.Threads[0].URL)

	o, err = buildOverview(now, nil, nil, nil, store.Traffic{Requests: make([]int, 60), Failed: make([]int, 60), Switches: make([]int, 60),
		FailedAttempts: make([]int, 60)}, 0, 0)
	require.NoError(t, err)
	assert.Contains(t, o.Charts[0].SVG, ">requests / min</text>", "an empty window is charted too, with its axes")
	assert.Equal(t, "bad", o.Cards[0].Tone, "no account: the pool is down")
	assert.Empty(t, o.Threads)
	assert.Empty(t, o.Classes)
}
