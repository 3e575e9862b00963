package web

import (
	"cmp"
	"context"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/store"
)

// Default upstream base URLs per account kind.
const (
	DefaultChatGPTBaseURL = "https://chatgpt.com/backend-api/codex"
	DefaultOpenAIBaseURL  = "https://api.openai.com/v1"
)

// AccountView is an account as the API shows it. It never holds credentials.
type AccountView struct {
	ID              string     `json:"id"`
	Kind            string     `json:"kind"`
	Label           string     `json:"label"`
	BaseURL         string     `json:"base_url"`
	Organization    string     `json:"organization"`
	AccountID       string     `json:"account_id,omitempty"`
	Email           string     `json:"email,omitempty"`
	PlanType        string     `json:"plan_type,omitempty"`
	Tags            []string   `json:"tags"`
	Status          string     `json:"status"`
	StatusReason    string     `json:"status_reason"`
	StatusUntil     *time.Time `json:"status_until"`
	StatusChangedAt time.Time  `json:"status_changed_at"`
	Priority        int        `json:"priority"`
	MaxConcurrency  int        `json:"max_concurrency"`
	// ProxyURL is the account's outbound proxy without its password
	// (user:***@), "" for none.
	ProxyURL        string     `json:"proxy_url"`
	AccessExpiresAt *time.Time `json:"access_expires_at,omitempty"`
	Usage           UsageView  `json:"usage"`
	CreatedAt       time.Time  `json:"created_at"`
	UpdatedAt       time.Time  `json:"updated_at"`
}

type UsageView struct {
	Primary   *WindowView `json:"primary"`
	Secondary *WindowView `json:"secondary"`
	UpdatedAt *time.Time  `json:"updated_at"`
}

type WindowView struct {
	UsedPercent   float64    `json:"used_percent"`
	WindowMinutes int        `json:"window_minutes"`
	ResetAt       *time.Time `json:"reset_at"`
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func viewWindow(w store.Window) *WindowView {
	if !w.Known {
		return nil
	}
	return &WindowView{UsedPercent: w.UsedPercent, WindowMinutes: w.WindowMinutes, ResetAt: optTime(w.ResetAt)}
}

func viewAccount(a store.Account) AccountView {
	tags := a.Tags
	if tags == nil {
		tags = []string{}
	}
	return AccountView{
		ID: a.ID, Kind: string(a.Kind), Label: a.Label, BaseURL: a.BaseURL, Organization: a.Organization,
		AccountID: a.ChatGPTAccountID, Email: a.Email, PlanType: a.PlanType, Tags: tags,
		Status: string(a.Status), StatusReason: a.StatusReason, StatusUntil: optTime(a.StatusUntil),
		StatusChangedAt: a.StatusChangedAt, Priority: a.Priority, MaxConcurrency: a.MaxConcurrency,
		ProxyURL: a.Proxy.String(), AccessExpiresAt: optTime(a.AccessExpiresAt),
		Usage:     UsageView{Primary: viewWindow(a.Primary), Secondary: viewWindow(a.Secondary), UpdatedAt: optTime(a.UsageUpdatedAt)},
		CreatedAt: a.CreatedAt, UpdatedAt: a.UpdatedAt,
	}
}

// AccountForm is the body of POST /accounts and PATCH /accounts/{id}. On
// PATCH, absent fields are kept and credential fields given replace theirs;
// proxy_url "" removes the proxy.
type AccountForm struct {
	Label          *string   `json:"label"`
	Kind           *string   `json:"kind"`
	BaseURL        *string   `json:"base_url"`
	Organization   *string   `json:"organization"`
	APIKey         *string   `json:"api_key"`
	AccessToken    *string   `json:"access_token"`
	RefreshToken   *string   `json:"refresh_token"`
	IDToken        *string   `json:"id_token"`
	AccountID      *string   `json:"account_id"`
	Email          *string   `json:"email"`
	PlanType       *string   `json:"plan_type"`
	Tags           *[]string `json:"tags"`
	Priority       *int      `json:"priority"`
	MaxConcurrency *int      `json:"max_concurrency"`
	// ProxyURL is the outbound proxy, http://, https:// or socks5://,
	// user:password@ allowed; it is a secret like the credentials.
	ProxyURL *string `json:"proxy_url"`

	// accessExpiresAt is when a login's access token expires, for the
	// accounts an import or a sign-in adds (the API takes no such field).
	accessExpiresAt time.Time
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return strings.TrimSpace(*p)
}

// validBaseURL accepts absolute http(s) URLs without credentials or query.
func validBaseURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return badField("base_url", "must be an absolute http:// or https:// URL")
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return badField("base_url", "must not hold credentials, a query or a fragment")
	}
	return nil
}

func (f AccountForm) validateCommon() error {
	if f.Label != nil && str(f.Label) == "" {
		return badField("label", "must not be blank")
	}
	if f.BaseURL != nil {
		if err := validBaseURL(str(f.BaseURL)); err != nil {
			return err
		}
	}
	if f.Priority != nil && (*f.Priority < -1000 || *f.Priority > 1000) {
		return badField("priority", "must be between -1000 and 1000")
	}
	if f.MaxConcurrency != nil && (*f.MaxConcurrency < 0 || *f.MaxConcurrency > 100000) {
		return badField("max_concurrency", "must be between 0 (no cap) and 100000")
	}
	if _, err := f.proxy(); err != nil {
		return err
	}
	return nil
}

// proxy parses proxy_url; absent and "" are both no proxy. The error never
// quotes the URL: it may hold a password.
func (f AccountForm) proxy() (store.Proxy, error) {
	p, err := store.ParseProxy(str(f.ProxyURL))
	if err != nil {
		return store.Proxy{}, badField("proxy_url", "%s", strings.TrimPrefix(err.Error(), "proxy_url: "))
	}
	return p, nil
}

// newAccount turns a creation form into an account and its credentials.
func (f AccountForm) newAccount() (store.Account, store.Credentials, error) {
	if err := f.validateCommon(); err != nil {
		return store.Account{}, store.Credentials{}, err
	}
	kind := store.Kind(str(f.Kind))
	if kind == "" {
		kind = store.KindOpenAI
		if str(f.AccessToken) != "" {
			kind = store.KindChatGPT
		}
	}
	if !kind.Valid() {
		return store.Account{}, store.Credentials{}, badField("kind", "must be chatgpt, openai or compatible")
	}
	a := store.Account{
		Kind: kind, Label: str(f.Label), BaseURL: str(f.BaseURL), Organization: str(f.Organization),
		ChatGPTAccountID: str(f.AccountID), Email: str(f.Email), PlanType: str(f.PlanType), AccessExpiresAt: f.accessExpiresAt,
	}
	if f.Tags != nil {
		a.Tags = *f.Tags
	}
	if f.Priority != nil {
		a.Priority = *f.Priority
	}
	if f.MaxConcurrency != nil {
		a.MaxConcurrency = *f.MaxConcurrency
	}
	proxy, err := f.proxy()
	if err != nil {
		return a, store.Credentials{}, err
	}
	a.Proxy = proxy
	c := store.Credentials{APIKey: str(f.APIKey), AccessToken: str(f.AccessToken), RefreshToken: str(f.RefreshToken), IDToken: str(f.IDToken)}
	switch kind {
	case store.KindChatGPT:
		if c.APIKey != "" {
			return a, c, badField("api_key", "not used by chatgpt accounts (send access_token)")
		}
		if c.AccessToken == "" && c.RefreshToken == "" {
			return a, c, badField("access_token", "required for chatgpt accounts (or a refresh_token)")
		}
		if a.ChatGPTAccountID == "" {
			return a, c, badField("account_id", "required for chatgpt accounts (the ChatGPT-Account-Id)")
		}
		if a.BaseURL == "" {
			a.BaseURL = DefaultChatGPTBaseURL
		}
		if a.Label == "" {
			a.Label = cmp.Or(a.Email, a.ChatGPTAccountID)
		}
	default:
		if c.AccessToken != "" || c.RefreshToken != "" || c.IDToken != "" {
			return a, c, badField("access_token", "only chatgpt accounts take tokens (send api_key)")
		}
		if c.APIKey == "" {
			return a, c, badField("api_key", "required for %s accounts", kind)
		}
		if a.BaseURL == "" {
			if kind == store.KindCompatible {
				return a, c, badField("base_url", "required for compatible accounts")
			}
			a.BaseURL = DefaultOpenAIBaseURL
		}
		if a.Label == "" {
			a.Label = string(kind) + " " + c.APIKey[:min(len(c.APIKey), 6)] + "…"
		}
	}
	return a, c, nil
}

func (s *Server) listAccounts(c echo.Context) error {
	accounts, err := s.cfg.Store.Accounts(c.Request().Context())
	if err != nil {
		return err
	}
	out := make([]AccountView, len(accounts))
	for i, a := range accounts {
		out[i] = viewAccount(a)
	}
	return c.JSON(http.StatusOK, map[string]any{"accounts": out})
}

func (s *Server) createAccount(c echo.Context) error {
	var f AccountForm
	if err := decodeJSON(c, &f); err != nil {
		return err
	}
	created, err := s.addAccount(c, f, "account.create")
	if err != nil {
		return err
	}
	c.Response().Header().Set("Location", "/api/v1/accounts/"+created.ID)
	return c.JSON(http.StatusCreated, viewAccount(created))
}

func (s *Server) getAccount(c echo.Context) error {
	a, err := s.cfg.Store.Account(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, viewAccount(a))
}

func (s *Server) patchAccount(c echo.Context) error {
	var f AccountForm
	if err := decodeJSON(c, &f); err != nil {
		return err
	}
	a, err := s.updateAccount(c, c.Param("id"), f)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, viewAccount(a))
}

// accountPatch checks a PATCH form against the account it changes and
// turns it into the store's patch. Everything is checked here, before
// anything is written: the patch then applies in one update, whole or not
// at all.
func (s *Server) accountPatch(ctx context.Context, id string, f AccountForm) (store.AccountPatch, error) {
	if f.Kind != nil {
		return store.AccountPatch{}, badField("kind", "cannot be changed; add a new account instead")
	}
	if err := f.validateCommon(); err != nil {
		return store.AccountPatch{}, err
	}
	current, err := s.cfg.Store.Account(ctx, id)
	if err != nil {
		return store.AccountPatch{}, err
	}
	p := store.AccountPatch{Tags: f.Tags, Priority: f.Priority, MaxConcurrency: f.MaxConcurrency}
	if f.APIKey != nil || f.AccessToken != nil || f.RefreshToken != nil || f.IDToken != nil {
		cred, err := s.cfg.Store.Credentials(ctx, id)
		if err != nil {
			return store.AccountPatch{}, err
		}
		if current.Kind == store.KindChatGPT {
			if f.APIKey != nil {
				return store.AccountPatch{}, badField("api_key", "not used by chatgpt accounts")
			}
			if f.AccessToken != nil {
				cred.AccessToken = str(f.AccessToken)
			}
			if f.RefreshToken != nil {
				cred.RefreshToken = str(f.RefreshToken)
			}
			if f.IDToken != nil {
				cred.IDToken = str(f.IDToken)
			}
		} else {
			if f.AccessToken != nil || f.RefreshToken != nil || f.IDToken != nil {
				return store.AccountPatch{}, badField("access_token", "only chatgpt accounts take tokens")
			}
			if str(f.APIKey) == "" {
				return store.AccountPatch{}, badField("api_key", "must not be blank")
			}
			cred.APIKey = str(f.APIKey)
		}
		p.Credentials = &cred
	}
	if f.ProxyURL != nil {
		proxy, err := f.proxy()
		if err != nil {
			return store.AccountPatch{}, err
		}
		p.Proxy = &proxy
	}
	trimmed := func(v *string) *string {
		if v == nil {
			return nil
		}
		t := strings.TrimSpace(*v)
		return &t
	}
	p.Label, p.BaseURL, p.Organization = trimmed(f.Label), trimmed(f.BaseURL), trimmed(f.Organization)
	p.ChatGPTAccountID, p.Email, p.PlanType = trimmed(f.AccountID), trimmed(f.Email), trimmed(f.PlanType)
	if current.Kind == store.KindChatGPT && p.ChatGPTAccountID != nil && *p.ChatGPTAccountID == "" {
		return store.AccountPatch{}, badField("account_id", "must not be blank for chatgpt accounts")
	}
	return p, nil
}

// fieldsGiven names the fields a PATCH sets (never their values: some are
// credentials), for the audit log.
func (f AccountForm) fieldsGiven() []string {
	var out []string
	for _, p := range []struct {
		name string
		set  bool
	}{{"label", f.Label != nil}, {"base_url", f.BaseURL != nil}, {"organization", f.Organization != nil},
		{"api_key", f.APIKey != nil}, {"access_token", f.AccessToken != nil}, {"refresh_token", f.RefreshToken != nil},
		{"id_token", f.IDToken != nil}, {"account_id", f.AccountID != nil}, {"email", f.Email != nil},
		{"plan_type", f.PlanType != nil}, {"tags", f.Tags != nil}, {"priority", f.Priority != nil},
		{"max_concurrency", f.MaxConcurrency != nil}, {"proxy_url", f.ProxyURL != nil}} {
		if p.set {
			out = append(out, p.name)
		}
	}
	if len(out) == 0 {
		return []string{"nothing"}
	}
	return out
}

func (s *Server) deleteAccount(c echo.Context) error {
	if _, err := s.removeAccount(c, c.Param("id")); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// statusForm is the optional body of pause.
type statusForm struct {
	Reason string `json:"reason"`
}

func (s *Server) pauseAccount(c echo.Context) error {
	var f statusForm
	if c.Request().ContentLength != 0 {
		if err := decodeJSON(c, &f); err != nil {
			return err
		}
	}
	a, err := s.setAccountPaused(c, c.Param("id"), true, f.Reason)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, viewAccount(a))
}

func (s *Server) resumeAccount(c echo.Context) error {
	a, err := s.setAccountPaused(c, c.Param("id"), false, "")
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, viewAccount(a))
}

func (s *Server) probeAccountAPI(c echo.Context) error {
	a, err := s.probeAccount(c, c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, viewAccount(a))
}
