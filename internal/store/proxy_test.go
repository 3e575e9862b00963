package store_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/logbuf"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
)

// proxySecret is the proxy password the tests look for where it must not be.
const proxySecret = "pr0xy-s3cret"

func TestParseProxy(t *testing.T) {
	t.Parallel()
	valid := []struct{ name, in, display, full string }{
		{"http", "http://127.0.0.1:3128", "http://127.0.0.1:3128", "http://127.0.0.1:3128"},
		{"https with user and password", "https://alice:" + proxySecret + "@proxy.example:443", "https://alice:***@proxy.example:443", "https://alice:" + proxySecret + "@proxy.example:443"},
		{"socks5", "socks5://u:" + proxySecret + "@10.0.0.1:1080", "socks5://u:***@10.0.0.1:1080", "socks5://u:" + proxySecret + "@10.0.0.1:1080"},
		{"socks5h, user only", "socks5h://bob@h:1080", "socks5h://bob@h:1080", "socks5h://bob@h:1080"},
		{"scheme in capitals", "SOCKS5://h:1080", "socks5://h:1080", "socks5://h:1080"},
		{"trailing slash", " http://h:8080/ ", "http://h:8080", "http://h:8080"},
		{"ipv6", "http://[::1]:3128", "http://[::1]:3128", "http://[::1]:3128"},
		{"escaped password", "http://u:p%40ss%3A" + proxySecret + "@h:1", "http://u:***@h:1", "http://u:p%40ss%3A" + proxySecret + "@h:1"},
	}
	for _, tc := range valid {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := store.ParseProxy(tc.in)
			require.NoError(t, err)
			assert.Equal(t, tc.display, p.String())
			u, err := p.URL()
			require.NoError(t, err)
			assert.Equal(t, tc.full, u.String())
			for _, shown := range []string{fmt.Sprint(p), fmt.Sprintf("%+v", p), fmt.Sprintf("%#v", p), fmt.Sprintf("%+v", store.Account{Proxy: p})} {
				assert.NotContains(t, shown, proxySecret)
			}
		})
	}
	none, err := store.ParseProxy("  ")
	require.NoError(t, err)
	assert.True(t, none.IsZero())
	u, err := none.URL()
	assert.NoError(t, err)
	assert.Nil(t, u)

	invalid := []struct{ name, in, want string }{
		{"ftp", "ftp://u:" + proxySecret + "@h:21", "scheme"},
		{"no scheme", "u:" + proxySecret + "@h:1080", "scheme"},
		{"host only", "h:1080", "scheme"},
		{"no port", "http://u:" + proxySecret + "@h", "port"},
		{"port zero", "http://h:0", "port"},
		{"port too high", "socks5://h:70000", "port"},
		{"no host", "http://:3128", "host"},
		{"path", "http://u:" + proxySecret + "@h:3128/proxy", "path"},
		{"query", "http://h:3128?x=" + proxySecret, "query"},
		{"fragment", "http://h:3128#" + proxySecret, "fragment"},
		{"bad escape", "http://u:" + proxySecret + "%zz@h:1", "not a valid URL"},
	}
	for _, tc := range invalid {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := store.ParseProxy(tc.in)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "proxy_url: ", "the error names the field")
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), proxySecret, "the error never quotes the URL")
		})
	}
}

// An error of a request through a proxy loses the proxy's password from its
// text and keeps its chain.
func TestProxyRedact(t *testing.T) {
	t.Parallel()
	p, err := store.ParseProxy("socks5://alice:" + proxySecret + "@127.0.0.1:1080")
	require.NoError(t, err)
	cause := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("refused")}
	leaky := fmt.Errorf("proxyconnect socks5://alice:%s@127.0.0.1:1080 (%s): %w", proxySecret, proxySecret, cause)
	got := p.Redact(leaky)
	assert.NotContains(t, got.Error(), proxySecret)
	assert.Contains(t, got.Error(), "socks5://alice:***@127.0.0.1:1080")
	var op *net.OpError
	assert.ErrorAs(t, got, &op, "the chain is kept for classification")
	clean := errors.New("dial tcp 127.0.0.1:443: refused")
	assert.Same(t, clean, p.Redact(clean), "an error without the secret is returned as it is")
	assert.NoError(t, p.Redact(nil))
	assert.Same(t, leaky, store.Proxy{}.Redact(leaky), "no proxy: nothing to hide")
}

// An account's proxy URL is sealed at rest (its password in no column in
// clear), read back whole only through Proxy.URL, shown without its
// password, replaced and removed by a patch; a store with another key
// lists the account but will not hand out a proxy it cannot open.
func TestAccountProxySealed(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			dbURL := b.URL(t)
			var logs logbuf.Buffer
			s := storetest.Open(t, dbURL, store.Options{})
			full := "http://alice:" + proxySecret + "@127.0.0.1:3128"
			p, err := store.ParseProxy(full)
			require.NoError(t, err)
			a, err := s.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "a", Proxy: p}, store.Credentials{APIKey: "sk-a"})
			require.NoError(t, err)
			plain, err := s.CreateAccount(ctx, store.Account{Kind: store.KindOpenAI, Label: "b"}, store.Credentials{APIKey: "sk-b"})
			require.NoError(t, err)

			got, err := s.Account(ctx, a.ID)
			require.NoError(t, err)
			assert.Equal(t, "http://alice:***@127.0.0.1:3128", got.Proxy.String())
			u, err := got.Proxy.URL()
			require.NoError(t, err)
			assert.Equal(t, full, u.String())
			list, err := s.Accounts(ctx)
			require.NoError(t, err)
			require.Len(t, list, 2)
			for _, l := range list {
				lu, err := l.Proxy.URL()
				require.NoError(t, err)
				if l.ID == a.ID {
					assert.Equal(t, full, lu.String())
				} else {
					assert.Nil(t, lu, "an account without a proxy has none")
				}
			}
			slog.New(slog.NewTextHandler(&logs, nil)).Info("account", "account", got, "proxy", got.Proxy)
			for _, shown := range []string{fmt.Sprintf("%v", got), fmt.Sprintf("%+v", got), fmt.Sprintf("%#v", got), logs.String()} {
				assert.NotContains(t, shown, proxySecret)
			}

			loc, err := store.ParseLocation(dbURL)
			require.NoError(t, err)
			raw, err := sqlx.Open(string(loc.Dialect), loc.DSN)
			require.NoError(t, err)
			defer raw.Close()
			rows, err := raw.Queryx(raw.Rebind(`SELECT * FROM accounts WHERE id = ?`), a.ID)
			require.NoError(t, err)
			n := 0
			for rows.Next() {
				n++
				row := map[string]any{}
				require.NoError(t, rows.MapScan(row))
				for col, v := range row {
					assert.NotContains(t, fmt.Sprintf("%s", v), proxySecret, "column %s holds the proxy password in clear", col)
				}
				assert.Equal(t, "http://alice:***@127.0.0.1:3128", fmt.Sprintf("%s", row["proxy_display"]))
				assert.NotEmpty(t, row["proxy_url"])
			}
			require.NoError(t, rows.Err())
			require.Equal(t, 1, n)

			wrong := storetest.Open(t, dbURL, store.Options{SecretKey: []byte("another secret key entirely....")})
			w, err := wrong.Account(ctx, a.ID)
			require.NoError(t, err, "the account still lists")
			assert.Equal(t, "http://alice:***@127.0.0.1:3128", w.Proxy.String())
			_, err = w.Proxy.URL()
			assert.ErrorIs(t, err, store.ErrUnseal, "a proxy that does not open is an error, never no proxy")

			var sealed string
			require.NoError(t, raw.Get(&sealed, raw.Rebind(`SELECT proxy_url FROM accounts WHERE id = ?`), a.ID))
			_, err = raw.Exec(raw.Rebind(`UPDATE accounts SET proxy_url = ?, proxy_display = 'moved' WHERE id = ?`), sealed, plain.ID)
			require.NoError(t, err)
			moved, err := s.Account(ctx, plain.ID)
			require.NoError(t, err)
			_, err = moved.Proxy.URL()
			assert.ErrorIs(t, err, store.ErrUnseal, "the sealed URL is bound to its row")
			_, err = raw.Exec(raw.Rebind(`UPDATE accounts SET credentials = ? WHERE id = ?`), sealed, plain.ID)
			require.NoError(t, err)
			_, err = s.Credentials(ctx, plain.ID)
			assert.ErrorIs(t, err, store.ErrUnseal, "a sealed proxy URL does not open as credentials")

			next, err := store.ParseProxy("socks5://bob:" + proxySecret + "2@127.0.0.1:1080")
			require.NoError(t, err)
			patched, err := s.UpdateAccount(ctx, a.ID, store.AccountPatch{Proxy: &next})
			require.NoError(t, err)
			assert.Equal(t, "socks5://bob:***@127.0.0.1:1080", patched.Proxy.String())
			u, err = patched.Proxy.URL()
			require.NoError(t, err)
			assert.Equal(t, "socks5://bob:"+proxySecret+"2@127.0.0.1:1080", u.String())
			label := "kept"
			patched, err = s.UpdateAccount(ctx, a.ID, store.AccountPatch{Label: &label})
			require.NoError(t, err)
			assert.Equal(t, "socks5://bob:***@127.0.0.1:1080", patched.Proxy.String(), "a patch without a proxy keeps it")
			require.NoError(t, s.SetCredentials(ctx, a.ID, store.Credentials{APIKey: "sk-rotated"}, got.AccessExpiresAt))
			kept, err := s.Account(ctx, a.ID)
			require.NoError(t, err)
			assert.Equal(t, patched.Proxy.String(), kept.Proxy.String(), "new credentials keep the proxy")

			patched, err = s.UpdateAccount(ctx, a.ID, store.AccountPatch{Proxy: &store.Proxy{}})
			require.NoError(t, err)
			assert.True(t, patched.Proxy.IsZero())
			u, err = patched.Proxy.URL()
			assert.NoError(t, err)
			assert.Nil(t, u, "removed")
		})
	}
}
