package web_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/alert"
	"github.com/codexrelay/codex-relay/internal/store"
	"github.com/codexrelay/codex-relay/internal/store/storetest"
	"github.com/codexrelay/codex-relay/web"
)

// The Webhooks page in a real browser: a webhook added through its form
// (a refused one first), sent a test event with the button, its delivery
// followed on its page until delivered, and removed; the receiver on
// loopback got the test event, signed with the secret typed in the form.
// Screenshots in test-output/webhooks.
func TestConsoleWebhooksInABrowser(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	chromium, node := browserTools(t, root)

	type got struct {
		body []byte
		sig  string
	}
	received := make(chan got, 8)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusNoContent)
		select {
		case received <- got{body: b, sig: r.Header.Get(alert.SignatureHeader)}:
		default:
		}
	}))
	t.Cleanup(rcv.Close)

	st := storetest.Open(t, storetest.SQLiteURL(t), store.Options{})
	d := alert.NewDeliverer(alert.DelivererConfig{Store: st, Replica: "e2e", Poll: 50 * time.Millisecond})
	dctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { d.Run(dctx) })
	t.Cleanup(func() { stop(); wg.Wait() })

	srv := web.New(web.Config{Store: st, AdminTokenHash: web.HashAdminToken(e2eAdminToken), KickAlerts: d.Kick})
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
		srv.Close()
	})

	out := filepath.Join(root, "test-output", "webhooks")
	require.NoError(t, os.MkdirAll(out, 0o755))
	stdout := runBrowserScript(t, root, node, "webhooks.mjs", 3*time.Minute, "RELAY_URL="+ts.URL, "ADMIN_TOKEN="+e2eAdminToken, "CHROMIUM="+chromium, "OUT_DIR="+out,
		"RECEIVER_URL="+rcv.URL+"/hook")
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	var result struct {
		OK bool `json:"ok"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &result))
	require.True(t, result.OK)

	select {
	case g := <-received:
		assert.True(t, alert.Verify("browser-secret", g.body, g.sig), "signed with the secret typed in the form")
		var ev alert.Event
		require.NoError(t, json.Unmarshal(g.body, &ev))
		assert.Equal(t, alert.Test, ev.Type)
	default:
		t.Fatal("the receiver got nothing, yet the page said delivered")
	}
	ws, err := st.Webhooks(context.Background())
	require.NoError(t, err)
	assert.Empty(t, ws, "removed in the browser")
}
