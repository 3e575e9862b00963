// Package ui holds the admin console's templ components and the view models
// they render. Handlers in package web build the view models from the store
// and the relay; components only lay them out. Every value a component shows
// is escaped by templ; components never see store types.
package ui

import "github.com/codexrelay/codex-relay/internal/roles"

// Frame is what every console page shares: its title, the active entry of
// the navigation, the session's CSRF token for its forms, and a one-time
// message from the previous action. Intro names the page whose one-line
// explanation is shown under the title ("" none); Search is what the
// header's search box holds.
type Frame struct {
	Title  string
	Nav    string
	Intro  string
	Search string
	CSRF   string
	Flash  *Flash
	// Who is signed in (an email, or admin-token) and Role theirs: pages
	// show only the actions the role may take (the server refuses the rest).
	Who, Role string
	// Person is set when a person is signed in (not the admin token): they
	// have tokens of their own.
	Person bool
}

// Operates reports whether the signed-in role acts on traffic (operator or
// admin): binding resets, pins, pauses, client keys, usage exports.
func (f Frame) Operates() bool { return roles.Role(f.Role).Covers(roles.Operator) }

// Administers reports whether the signed-in role is admin: accounts,
// people, settings, prices.
func (f Frame) Administers() bool { return roles.Role(f.Role).Covers(roles.Admin) }

// Flash is a one-time message; Kind is "ok" or "error".
type Flash struct {
	Kind, Text string
}

// Pager describes one page of a list: rows From to To of Total, and the
// links to the pages around it ("" when there is none).
type Pager struct {
	From, To, Total int
	Prev, Next      string
}

// Option is one choice of a select.
type Option struct {
	Value, Label string
	Selected     bool
}

// Login is the login page.
type Login struct {
	CSRF  string
	Next  string
	Error string
	// SSO offers the single sign-on (the relay has an OpenID provider).
	SSO bool
}

// SignedIn is the page a single sign-on lands on, which moves on to Next.
type SignedIn struct {
	Next string
}

// ErrorView is a console error page: Message is safe to show.
type ErrorView struct {
	Status  int
	Title   string
	Message string
}

// Overview is the pool at a glance over a recent window.
type Overview struct {
	Window    string // e.g. "last 60 min"
	UpdatedAt string
	Cards     []Card
	// Charts are requests, and failed attempts and switches, per minute.
	Charts   []UsageChart
	Classes  []ClassCount
	Threads  []ThreadRow
	Accounts []AccountRow
}

// Card is one headline number. Tone is "", "ok", "warn" or "bad".
type Card struct {
	Label, Value, Note, Tone string
}

// ClassCount is how many attempts ended in one class; Width is its bar in
// percent of the largest.
type ClassCount struct {
	Class, Tone, URL string
	Count, Width     int
}

// ThreadRow is one busy thread of the overview.
type ThreadRow struct {
	Thread, Session, Account, LastSeen, URL string
	Requests, Switches, Errors              int
}

// AccountRow is one account: state, usage and load.
type AccountRow struct {
	ID, Label, Kind, Organization, Email, Plan, BaseURL, Tags string
	// Proxy is the account's outbound proxy, without its password ("" none).
	Proxy                       string
	Status, Tone, Reason, Until string
	Usage                       []Usage
	InFlight, Lanes, Bindings   int
	// LaneCap is the cap every upstream WebSocket of the account counts
	// against, on each replica (0: unknown).
	LaneCap                                  int
	Paused                                   bool
	BindingsURL, RequestsURL, DiagnosticsURL string
	// URL is the account's page.
	URL string
	// ResumeHint says what Resume does for the account's status; "" when
	// it is active and there is nothing to resume.
	ResumeHint string
}

// Usage is one usage window of an account: Percent used (0-100, drawn as a
// bar), and when it resets.
type Usage struct {
	Label, Text, Reset, Tone string
	Percent                  int
}

// Accounts lists the accounts, the sign-ins of this replica, and the
// forms to add one.
type Accounts struct {
	Accounts []AccountRow
	SignIns  []SignIn
	Form     AccountForm
}

// AccountDetail is one account's page: its state and settings, and the
// form that edits them.
type AccountDetail struct {
	Account                  AccountRow
	ChatGPT                  bool
	Priority, MaxConcurrency string
	Created, Updated         string
	AccessExpires            string // "" when unknown or not a ChatGPT account
	Form                     AccountEditForm
}

// AccountEditForm holds the edit form's fields: the account's own, or
// what the operator typed when the form was refused. ProxyURL is a proxy
// typed that holds no password (one that does is never sent back:
// ProxyDropped); Proxy is the account's current one, without its password.
type AccountEditForm struct {
	Label, BaseURL, Organization, Tags, Priority, MaxConcurrency string
	AccountID, Email, PlanType                                   string
	ProxyURL, Proxy                                              string
	NoProxy, ProxyDropped                                        bool
}

// AccountRemoval is the confirmation page of removing an account: what
// goes with it. Threads and Sessions are its bindings of each kind,
// PinnedThreads and PinnedSessions its pins; Others counts the accounts
// left; KeysOnly names the client keys limited to it alone, KeysAlso those
// limited to it and others.
type AccountRemoval struct {
	Account                       AccountRow
	Threads, Sessions             int
	PinnedThreads, PinnedSessions int
	Others                        int
	KeysOnly, KeysAlso            []string
}

// SignIn is a ChatGPT device-code sign-in started from the console: the
// code to enter at VerificationURL while Pending, then its outcome.
type SignIn struct {
	ID, URL, UserCode, VerificationURL string
	State, Tone, Message               string
	Started, Expires                   string
	Pending                            bool
	AccountLabel, AccountURL           string // the account it added or signed in again
	LiveURL                            string // its live region's stream, on its page
}

// AccountForm holds what an operator typed into the add form, to show it
// again after an error. It never holds credentials.
type AccountForm struct {
	Kind, Label, BaseURL, Organization, AccountID, Email, Tags string
}

// Bindings is the binding search, its results and the reset and pin
// forms.
type Bindings struct {
	Search   BindingSearch
	Rows     []BindingRow
	Pager    Pager
	Return   string // this page's URL, where the forms come back to
	Accounts []Option
	// Objects are the files and stored responses the searched thread
	// created through the relay: each lives on its account.
	Objects []ObjectRow
}

// ObjectRow is one object a thread created.
type ObjectRow struct {
	ID, Kind, Account, AccountURL, Created, Expires string
}

// BindingSearch is the search form's state and choices.
type BindingSearch struct {
	Session, Thread string
	Accounts        []Option
	Keys            []Option
	Kinds           []Option
	Filtered        bool
}

// BindingRow is one binding.
type BindingRow struct {
	ID, Kind, Strength, Source string
	// Why says in words how the binding was set (its Source).
	Why                               string
	Pin                               bool
	AccountID, Account                string
	Session, Thread, ClientKey        string
	Age, Created, LastSeen, Expires   string
	Abandoned                         string
	SessionURL, ThreadURL, AccountURL string
	// RequestsURL is the thread's requests and usage ("" without a thread).
	RequestsURL string
	// Moves names the live lanes a pin moves off at their next request
	// ("" none): the pin's threads still running on another account.
	Moves string
}

// Lanes lists the live lanes of this replica.
type Lanes struct {
	Lanes []LaneRow
}

// LaneRow is one live upstream lane.
type LaneRow struct {
	Kind, Account, AccountID, Session, Thread, Age, Opened, URL, Replica string
	// KindNote says what the kind of lane is for.
	KindNote string
	Requests int64
	// Retiring: the lane closes at the end of its turn.
	Retiring bool
}

// Diagnostics shows attempt timelines grouped by request.
type Diagnostics struct {
	Filter   DiagnosticsFilter
	Requests []Timeline
	Pager    Pager
	LiveURL  string
}

// DiagnosticsFilter is the filter form's state and choices.
type DiagnosticsFilter struct {
	Request, Thread string
	Classes         []Option
	Recoveries      []Option
	Accounts        []Option
}

// Timeline is one request's attempts, first to last.
type Timeline struct {
	// URL is the timeline alone; RequestURL the request's own page.
	RequestID, Thread, Session, Started, Total, Outcome, Tone, URL string
	RequestURL                                                     string
	Attempts                                                       []AttemptRow
}

// AttemptRow is one attempt on one account; BarX and BarW place it on the
// request's timeline, in percent.
type AttemptRow struct {
	Seq                                  int
	Account, From, Class, Tone, Recovery string
	// AccountURL is the account's requests ("" for an attempt selection
	// refused before choosing one).
	AccountURL                        string
	Action, Status, ErrorCode, Detail string
	Duration, FirstEvent, Started     string
	BarX, BarW                        int
	// Matched: the page's filter (a class, a recovery, an account)
	// selected this attempt; the request's others are shown with it.
	Matched bool
}

// Requests is the request log with its filters; Thread, when the log is
// filtered by a thread, is that thread's usage.
type Requests struct {
	Filter RequestFilter
	Thread *ThreadUsage
	Rows   []RequestRow
	Pager  Pager
}

// ThreadUsage sums one thread's requests: tokens by kind, cost, cache-hit
// rate, time to first token (p50 / p95), and the accounts that served it,
// in the order they first did.
type ThreadUsage struct {
	Thread                                  string
	Requests, Errors                        string
	Input, Cached, Output, Reasoning, Total string
	Cost, CacheRate, TTFT                   string
	Accounts                                []ThreadAccount
}

// ThreadAccount is one account that served a thread: its share, its
// cache-hit rate, and the span of its requests.
type ThreadAccount struct {
	Name, URL, Requests, Tokens, CacheRate, Span string
}

// RequestFilter is the filter form's state and choices.
type RequestFilter struct {
	Thread, Session string
	Accounts        []Option
	Keys            []Option
	Transports      []Option
}

// RequestRow is one request of the log.
type RequestRow struct {
	// URL is the request's own page.
	URL                                                                  string
	ID, Started, StartedFull, Transport, Path, Model, Account, AccountID string
	Thread, Session, ClientKey, Status, Tone, ErrorCode, Recovery        string
	FirstEvent, Duration, Tokens, DiagnosticsURL, ThreadURL              string
}

// Keys lists client keys and the form to create one. Created is set
// only in the answer to the creation, which shows the secret once.
type Keys struct {
	Keys     []KeyRow
	Created  *CreatedKey
	Form     KeyForm
	Accounts []Option
	// FirstKey: no client key was ever created, so the relay runs keyless
	// (loopback clients only, without a key) until the form creates one.
	FirstKey bool
}

// CreatedKey is a key just created, with its secret, and the Codex config
// block that uses it (web.CodexConfig, for the relay's address as the
// browser reached it).
type CreatedKey struct {
	Name, Secret, Config string
}

// KeyForm holds what an operator typed into the create form; Limits is
// one limit a line.
type KeyForm struct {
	Name, Tag, Models, ExpiresIn, Limits string
}

// KeyRow is one client key; URL is its page, Limits its limits in short.
type KeyRow struct {
	ID, Name, Prefix, Scope, Models, Expires, Created, LastUsed, State, Tone string
	Limits                                                                   string
	Requests                                                                 int64
	Revoked                                                                  bool
	URL, RequestsURL, BindingsURL                                            string
}

// Settings is a read-only view of the configuration.
type Settings struct {
	Groups []SettingGroup
}

// SettingGroup is a titled list of settings.
type SettingGroup struct {
	Title string
	Items []Setting
}

// Setting is one configuration value and what it means.
type Setting struct {
	Name, Value, Note string
}

// Audit is the audit log with its filters.
type Audit struct {
	Filter AuditFilter
	Rows   []AuditRow
	Pager  Pager
}

// AuditFilter is the filter form's state and choices.
type AuditFilter struct {
	Target  string
	Actors  []Option
	Actions []Option
}

// AuditRow is one admin action.
type AuditRow struct {
	At, AtFull, Actor, Address, Action, Target, Detail, Tone string
	User                                                     string // the person behind a token:<name> actor
}

// People is the people page.
type People struct {
	Users []PersonRow
	Form  PersonForm
}

// PersonRow is one person.
type PersonRow struct {
	ID, Email, Name, Role, State, Tone, LastSeen, Created string
	Disabled                                              bool
	Roles                                                 []Option // the role choice, theirs selected
}

// PersonForm is the add-a-person form as typed.
type PersonForm struct {
	Email, Name string
	Roles       []Option
}

// Tokens is a person's tokens page; UserID "" is the admin token's.
type Tokens struct {
	UserID, Email, Role string
	Tokens              []TokenRow
	Roles               []Option // the new token's role: theirs, or narrower
	Created             *CreatedKey
	// Sessions are the person's console sessions that stand (the admin
	// token's, on the admin token's own page).
	Sessions []SessionRow
}

// SessionRow is one standing console session.
type SessionRow struct {
	Created, Seen, Expires, Via string
	This                        bool // the session this page is seen in
}

// TokenRow is one personal token, never its secret.
type TokenRow struct {
	ID, Name, Prefix, Role, State, Tone, Expires, LastUsed, Created string
	Revoked                                                         bool
}
