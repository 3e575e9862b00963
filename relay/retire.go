package relay

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/internal/store"
)

// GoalMarker starts the user message of Codex's automatic goal
// continuation turn (PROTOCOL.md, "Compaction and goals").
const GoalMarker = `<codex_internal_context source="goal">`

// retirable are the durable unavailable statuses a goal restart may retire
// an owner for.
var retirable = []store.Status{store.StatusPaused, store.StatusRateLimited, store.StatusQuotaExceeded}

// retireScope records the interpretation and source of a retirement.
const retireScope = "process_session:goal_restart"

// retireCase is what the retirement rule looks at.
type retireCase struct {
	Source         hardSource
	OwnerStatus    store.Status
	OwnerInScope   bool // the owner lies inside the client key's account scope
	GoalMarker     bool // the request carries the goal-continuation marker
	SelfContained  bool // no previous_response_id, conversation, unresolved tool calls or file references
	AccountNeutral bool // no account-bound state either (a client turn state)
}

// mayRetire is seed 003's proof gate: only a raw session owner (an
// operator's pin or an imported row), durably paused, rate-limited or over
// quota, inside the key's scope, may be retired, and only by a goal-marked
// request that is self-contained and account-neutral. Turn-state,
// previous-response and lane owners never are.
func mayRetire(c retireCase) bool {
	if c.Source != hardSessionPin || !c.OwnerInScope || !c.GoalMarker || !c.SelfContained || !c.AccountNeutral {
		return false
	}
	for _, st := range retirable {
		if c.OwnerStatus == st {
			return true
		}
	}
	return false
}

// hasGoalMarker reports whether a user message of the input starts with the
// goal-continuation marker line.
func hasGoalMarker(input []json.RawMessage) bool {
	for _, raw := range input {
		var m struct {
			Type    string          `json:"type"`
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(raw, &m) != nil || m.Type != "message" || m.Role != "user" {
			continue
		}
		var text string
		if json.Unmarshal(m.Content, &text) != nil {
			var parts []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			}
			if json.Unmarshal(m.Content, &parts) != nil || len(parts) == 0 {
				continue
			}
			text = parts[0].Text
		}
		if strings.HasPrefix(strings.TrimLeft(text, " \t\r\n"), GoalMarker) {
			return true
		}
	}
	return false
}

// retireOwner applies the goal-restart retirement after selection failed
// with an unavailable owner: when the rule allows it and the compare-and-set
// wins, the owner is excluded from the rest of this selection (even if it
// read a stale snapshot) and the plan names the recovery; otherwise the request fails
// closed as before.
func (s *Server) retireOwner(ctx context.Context, r *request, p plan, ch choice, err error, exclude map[string]bool) (plan, bool) {
	var ou *ownerUnavailableError
	if !errors.As(err, &ou) {
		return p, false
	}
	var pin *store.Binding
	for i, b := range ch.rows {
		if b.Kind == store.BindRawSession && b.AccountID == ou.Account.ID {
			pin = &ch.rows[i]
		}
	}
	if pin == nil || !mayRetire(retireCase{
		Source: ou.Source, OwnerStatus: ou.Account.Status, OwnerInScope: ou.InScope,
		GoalMarker: hasGoalMarker(r.fields.Input), SelfContained: continuity.SelfContained(r.fields),
		AccountNeutral: r.turnState == "" || p.released,
	}) {
		return p, false
	}
	ok, rerr := s.cfg.Store.RetireOwner(ctx, pin.ID, ou.Account.ID, retirable, retireScope)
	if rerr != nil {
		s.log.Warn("retire owner", "binding", pin.ID, "err", rerr)
		return p, false
	}
	if !ok {
		return p, false // a concurrent recovery or owner change won
	}
	exclude[ou.Account.ID] = true
	p.recovery = RecoveryRetired
	return p, true
}
