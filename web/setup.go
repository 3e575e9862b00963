package web

import (
	"context"
	"fmt"

	"github.com/codexrelay/codex-relay/web/ui"
)

// The overview's first-run checklist: add an account, create a client key,
// point Codex at the relay. Each step is done when the store says so; the
// checklist is shown while one is left, and updates live.

// setupState is what the checklist reads from the store.
type setupState struct {
	Accounts int // accounts in the pool
	Keys     int // client keys neither revoked nor expired
	// Served: a client's request reached the relay: the request log has a
	// row, or a key was used (its count outlives the log's retention).
	Served bool
}

// readSetup reads the checklist's state. The request log is read only when
// no key counts a use.
func (s *Server) readSetup(ctx context.Context) (setupState, error) {
	n, err := s.names(ctx)
	if err != nil {
		return setupState{}, err
	}
	st := setupState{Accounts: len(n.accounts)}
	now := s.cfg.Now()
	for _, k := range n.keys {
		if k.RevokedAt.IsZero() && (k.ExpiresAt.IsZero() || k.ExpiresAt.After(now)) {
			st.Keys++
		}
		st.Served = st.Served || k.RequestCount > 0
	}
	if !st.Served {
		if st.Served, err = s.cfg.Store.AnyRequest(ctx); err != nil {
			return setupState{}, err
		}
	}
	return st, nil
}

// setupChecklist lays out the checklist for st, its last step showing
// config; nil once every step is done. Pure.
func setupChecklist(st setupState, config string) *ui.Setup {
	if st.Accounts > 0 && st.Keys > 0 && st.Served {
		return nil
	}
	steps := []ui.SetupStep{
		{ID: "account", Title: "Add an account", Done: st.Accounts > 0, State: "no account yet",
			Text: "The upstream credential the relay serves Codex with: an OpenAI API key, a ChatGPT account's tokens, or a Codex auth.json.",
			Link: "/admin/accounts", LinkText: "Add one on the Accounts page"},
		{ID: "key", Title: "Create a client key", Done: st.Keys > 0, State: "no usable key yet",
			Text: "The key Codex sends to the relay. Until the first one exists the relay serves loopback clients without a key; from then on every client needs one.",
			Link: "/admin/keys", LinkText: "Create one on the Client keys page"},
		{ID: "config", Title: "Point Codex at the relay", Done: st.Served, State: "no request from a client yet",
			Text: "Put this block in $CODEX_HOME/config.toml (~/.codex/config.toml by default), export your key as CODEX_RELAY_KEY where Codex runs, and run Codex once; the block is also shown with each new key.",
			Link: "#codex-config", LinkText: "The config block"},
	}
	if st.Accounts > 0 {
		steps[0].State = fmt.Sprintf("%d %s", st.Accounts, plural(st.Accounts, "account", "accounts"))
	}
	if st.Keys > 0 {
		steps[1].State = fmt.Sprintf("%d usable %s", st.Keys, plural(st.Keys, "key", "keys"))
	}
	if st.Served {
		steps[2].State = "a client's request reached the relay"
	}
	out := &ui.Setup{Steps: steps, Config: config}
	for _, s := range steps {
		if s.Done {
			out.Done++
		}
	}
	return out
}

// setupView is the checklist as the store stands, for a page the browser
// reached at baseURL.
func (s *Server) setupView(ctx context.Context, baseURL string) (*ui.Setup, error) {
	st, err := s.readSetup(ctx)
	if err != nil {
		return nil, err
	}
	return setupChecklist(st, CodexConfig(baseURL)), nil
}
