package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/codexrelay/codex-relay/web"
)

const bindingsPurpose = `See and reset bindings: which account serves each thread and process session,
and operators' pins. Resetting a thread's binding also makes the relay drop its
continuity entry and lane, so the thread's next request is placed afresh.`

var bindingVerbs = []string{"list", "reset"}

func runBindings(ctx context.Context, c cli, args []string) error {
	return runSubcommand(ctx, c, "bindings", bindingsPurpose, map[string]subcommand{
		"list":  {"", "list bindings, by session, thread, account, client key or kind", runBindingsList},
		"reset": {"", "reset one binding (-id), or those of a thread, a session or an account", runBindingsReset},
	}, bindingVerbs, args)
}

// apiBinding is the admin API's own binding type.
type apiBinding = web.BindingView

const bindingsListPurpose = `List bindings, most recently seen first: kind (pins marked), strength, account,
session, thread, client key, how each was set, and when it expires.`

func runBindingsList(ctx context.Context, c cli, name string, args []string) error {
	var af apiFlags
	var session, thread, account, clientKey, kind string
	var limit, offset int
	var asJSON bool
	fs := newVerbFlagSet(c, name, "", bindingsListPurpose, "")
	af.register(fs, c)
	fs.StringVar(&session, "session", "", "only bindings of this session id")
	fs.StringVar(&thread, "thread", "", "only bindings of this thread id")
	fs.StringVar(&account, "account", "", "only bindings to this account (id or label)")
	fs.StringVar(&clientKey, "client-key", "", "only bindings of this client key (id or name)")
	fs.StringVar(&kind, "kind", "", "only this kind: thread, session, raw_thread or raw_session (pins)")
	fs.IntVar(&limit, "limit", 100, "at most this many (1-1000)")
	fs.IntVar(&offset, "offset", 0, "skip this many")
	fs.BoolVar(&asJSON, "json", false, "print the API's JSON instead of a table")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("%s: unexpected arguments %q", name, pos)
	}
	api, err := newAPIClient(c, af.url)
	if err != nil {
		return err
	}
	if account, err = api.resolveOne(ctx, accountRef, mustExist, account); err != nil {
		return fmt.Errorf("%s: -account: %w", name, err)
	}
	if clientKey, err = api.resolveOne(ctx, keyRef, mustExist, clientKey); err != nil {
		return fmt.Errorf("%s: -client-key: %w", name, err)
	}
	q := url.Values{"limit": {strconv.Itoa(limit)}}
	if offset > 0 {
		q.Set("offset", strconv.Itoa(offset))
	}
	for k, v := range map[string]string{"session": session, "thread": thread, "account": account, "client_key": clientKey, "kind": kind} {
		if v = strings.TrimSpace(v); v != "" {
			q.Set(k, v)
		}
	}
	var raw json.RawMessage
	if err := api.do(ctx, "GET", "/bindings?"+q.Encode(), nil, &raw); err != nil {
		return err
	}
	if asJSON {
		return printJSON(c.stdout, raw)
	}
	var page struct {
		Bindings []apiBinding `json:"bindings"`
		Total    int          `json:"total"`
	}
	if err := json.Unmarshal(raw, &page); err != nil {
		return fmt.Errorf("%s: unexpected answer: %w", name, err)
	}
	if page.Total == 0 {
		fmt.Fprintln(c.stdout, "No bindings match.")
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tSTRENGTH\tACCOUNT\tSESSION\tTHREAD\tCLIENT KEY\tSET BY\tLAST SEEN\tEXPIRES")
	for _, b := range page.Bindings {
		k := b.Kind
		if b.Pin {
			k += " (pin)"
		}
		expires := "never"
		if b.ExpiresAt != nil {
			expires = when(b.ExpiresAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", b.ID, k, b.Strength, b.AccountID, dash(clipText(b.SessionID, 40)),
			dash(clipText(b.ThreadID, 40)), dash(b.ClientKey), dash(b.Source), when(&b.LastSeen), expires)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	shown := offset + len(page.Bindings)
	if shown < page.Total {
		fmt.Fprintf(c.stdout, "%d-%d of %d bindings; more with -offset %d\n", offset+1, shown, page.Total, shown)
	} else {
		fmt.Fprintf(c.stdout, "%d %s\n", page.Total, bindingsNoun(page.Total))
	}
	return nil
}

const bindingsResetPurpose = `Reset bindings: one binding by -id, or every binding of a -thread, a -session (its
threads included) or an -account. Give exactly one. A reset thread is placed
afresh on its next request; a reset pin stops pinning.`

func runBindingsReset(ctx context.Context, c cli, name string, args []string) error {
	var af apiFlags
	var id, thread, session, account string
	var asJSON bool
	fs := newVerbFlagSet(c, name, "", bindingsResetPurpose, "")
	af.register(fs, c)
	fs.StringVar(&id, "id", "", "reset this binding (an id from 'bindings list')")
	fs.StringVar(&thread, "thread", "", "reset the bindings of this thread id")
	fs.StringVar(&session, "session", "", "reset the bindings of this session id, its threads' included")
	fs.StringVar(&account, "account", "", "reset every binding to this account (id or label)")
	fs.BoolVar(&asJSON, "json", false, "print the API's JSON answer")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("%s: unexpected arguments %q", name, pos)
	}
	if len(nonBlank(id, thread, session, account)) != 1 {
		fs.Usage()
		return fmt.Errorf("%s: give exactly one of -id, -thread, -session, -account", name)
	}
	api, err := newAPIClient(c, af.url)
	if err != nil {
		return err
	}
	if account, err = api.resolveOne(ctx, accountRef, mustExist, account); err != nil {
		return fmt.Errorf("%s: -account: %w", name, err)
	}
	body := map[string]string{}
	var what string
	for _, sel := range []struct{ field, flag, v string }{
		{"binding_id", "binding", id}, {"thread_id", "thread", thread}, {"session_id", "session", session}, {"account_id", "account", account},
	} {
		if v := strings.TrimSpace(sel.v); v != "" {
			body[sel.field] = v
			what = sel.flag + " " + v
		}
	}
	var out struct {
		Reset int `json:"reset"`
	}
	if err := api.do(ctx, "POST", "/bindings/reset", body, &out); err != nil {
		return err
	}
	if asJSON {
		return printJSON(c.stdout, out)
	}
	switch {
	case id != "" && out.Reset == 0:
		fmt.Fprintf(c.stdout, "Nothing to reset: binding %s does not exist.\n", id)
	case id != "":
		fmt.Fprintf(c.stdout, "Reset binding %s.\n", id)
	case out.Reset == 0:
		fmt.Fprintf(c.stdout, "Nothing to reset: no binding of %s.\n", what)
	default:
		fmt.Fprintf(c.stdout, "Reset %d %s of %s.\n", out.Reset, bindingsNoun(out.Reset), what)
	}
	return nil
}

// nonBlank returns the values that are not blank.
func nonBlank(values ...string) []string {
	var out []string
	for _, v := range values {
		if strings.TrimSpace(v) != "" {
			out = append(out, v)
		}
	}
	return out
}

func bindingsNoun(n int) string {
	if n == 1 {
		return "binding"
	}
	return "bindings"
}
