package relay_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"image/png"
	"math/big"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/internal/codexcli"
	"github.com/codexrelay/codex-relay/internal/pricing"
	"github.com/codexrelay/codex-relay/internal/sim"
	"github.com/codexrelay/codex-relay/internal/store"
)

// imagePrice is what the tests' price table charges for one image of
// Codex's image model (gpt-image-2), with its tokens free: 0.04 dollars.
const imagePrice = 40_000_000

// priceImages stores a price table that prices Codex's chat model and its
// image model, the image at imagePrice per image and nothing per token.
func priceImages(ctx context.Context, t *testing.T, h *harness) {
	t.Helper()
	_, err := h.store.SavePriceTable(ctx, pricing.Table{Source: "test", Entries: []pricing.Entry{
		{Model: "gpt-5.5", Tier: pricing.TierDefault, Input: 5, CachedInput: 0.5, Output: 30},
		{Model: "gpt-image-2", Tier: pricing.TierDefault, PerImage: 0.04},
	}}, "test")
	require.NoError(t, err)
}

// chatGPTCodex is Codex signed in as a Codex Desktop or IDE user is, with
// ChatGPT, through the relay: its access token is the relay client key,
// chatgpt_base_url the relay's /backend-api/, and its model gpt-5.5, for
// which Codex offers its image tool.
func chatGPTCodex(t *testing.T, h *harness, key string) *codexcli.Codex {
	return codexcli.New(t, codexcli.Provider{BaseURL: h.codexBaseURL(), Key: key, Model: "gpt-5.5",
		ChatGPTLogin: true, ChatGPTBaseURL: h.srv.URL + "/backend-api/"})
}

// chatGPTCodexTLS is chatGPTCodex through the relay served over TLS (as
// Codex requires of a ChatGPT login's chatgpt_base_url), with a certificate
// of the test's own that Codex is told to trust.
//
// Its config.toml is README's ChatGPT sign-in block, as written but for the
// relay's address and no update check, and its auth.json what
// `codex-relay keys codex-auth` prints (codexauth.AuthJSON).
func chatGPTCodexTLS(t *testing.T, h *harness, key string) *codexcli.Codex {
	caPEM, leaf := testCertificates(t)
	srv := httptest.NewUnstartedServer(h.relay)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "relay-ca.pem")
	require.NoError(t, os.WriteFile(ca, caPEM, 0o600))
	codex := codexcli.New(t, codexcli.Provider{BaseURL: srv.URL + "/backend-api/codex", Key: key, Model: "gpt-5.5",
		ChatGPTLogin: true, ChatGPTBaseURL: srv.URL + "/backend-api/", CACertFile: ca})
	writeREADMEChatGPTConfig(t, codex.Home, srv.URL)
	return codex
}

// readmeRelayURL is the relay address README's ChatGPT sign-in block names.
const readmeRelayURL = "https://relay.example.com"

// writeREADMEChatGPTConfig makes README's ChatGPT sign-in block the
// CODEX_HOME's config.toml, for the relay at relayURL.
func writeREADMEChatGPTConfig(t *testing.T, home, relayURL string) {
	t.Helper()
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(readme), "\n### Image generation and the `/status` card: a ChatGPT sign-in through the relay\n")
	require.True(t, ok, "README has the ChatGPT sign-in section")
	m := regexp.MustCompile("(?s)```toml\n(.*?)```").FindStringSubmatch(section)
	require.NotNil(t, m, "the section has a toml block")
	block := m[1]
	require.Contains(t, block, `chatgpt_base_url = "`+readmeRelayURL+`/backend-api/"`)
	require.Contains(t, block, `base_url = "`+readmeRelayURL+`/backend-api/codex"`)
	require.Contains(t, block, "requires_openai_auth = true")
	require.Contains(t, section, "codex-relay keys codex-auth > ~/.codex/auth.json", "the section says how to write auth.json")
	cfg := "check_for_update_on_startup = false\n" + strings.ReplaceAll(block, readmeRelayURL, relayURL)
	require.NoError(t, os.WriteFile(filepath.Join(home, "config.toml"), []byte(cfg), 0o600))
}

// testCertificates makes a certificate authority (its certificate as PEM)
// and a server certificate for 127.0.0.1 it signed: Codex's TLS stack takes
// no self-signed certificate as a server's, as httptest's is.
func testCertificates(t *testing.T) (caPEM []byte, leaf tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "codex-relay test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames: []string{"localhost"}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// imagePrompt makes the sim's model call Codex's image tool.
const imagePrompt = `draw it [[sim:tool image_gen.imagegen {"prompt":"a red square"}]]`

// Image generation in the real Codex through the relay: Codex, signed in
// with ChatGPT (its token the relay's client key), offers its image tool;
// the model calls it, and Codex posts images/generations to the relay
// itself, with only its turn metadata to say which thread it is for. The
// image goes to the thread's account although the balancer now prefers
// the other one, comes back to Codex, which saves it and hands it to the
// model, and is charged at the price table's price per image, on the
// thread's row in the request log.
func TestCodexImageGeneration(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simAccount("a1", "org-a"), simAccount("a2", "org-a"))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	priceImages(ctx, t, h)
	_, key, err := h.store.CreateClientKey(ctx, store.ClientKey{Name: "desktop"})
	require.NoError(t, err)
	setUsed := func(simID string, pct float64) {
		require.NoError(t, h.store.UpdateUsage(ctx, h.ids[simID], store.Window{UsedPercent: pct, WindowMinutes: 300,
			ResetAt: time.Now().Add(time.Hour), Known: true}, store.Window{}))
	}
	codex := chatGPTCodex(t, h, key)

	setUsed("a2", 90) // the thread starts on a1
	first, err := codex.Exec(ctx, "hello", codexcli.RunOptions{})
	require.NoError(t, err)
	codexcli.RequireSuccess(t, first)
	require.NotEmpty(t, first.ThreadID)
	setUsed("a2", 0)
	setUsed("a1", 90) // a new thread would now go to a2

	res, err := codex.Resume(ctx, first.ThreadID, imagePrompt, codexcli.RunOptions{})
	require.NoError(t, err)
	codexcli.RequireSuccess(t, res)
	assert.Contains(t, res.FinalMessage, "[input_image]", "Codex handed the generated image to the model")
	assert.Contains(t, res.FinalMessage, "Generated images are saved to")

	saved, err := filepath.Glob(filepath.Join(codex.Home, "generated_images", first.ThreadID, "*.png"))
	require.NoError(t, err)
	require.Len(t, saved, 1, "Codex saved the image under its thread")
	raw, err := os.ReadFile(saved[0])
	require.NoError(t, err)
	_, err = png.Decode(bytes.NewReader(raw))
	require.NoError(t, err, "the saved image is the PNG the account made")

	var images []sim.Record
	for _, r := range h.sim.Records(sim.RecordFilter{}) {
		if r.Route == sim.RouteImagesGenerations {
			images = append(images, r)
		}
	}
	require.Len(t, images, 1)
	assert.Equal(t, "a1", images[0].Account, "the image was made on the thread's account")
	assert.False(t, images[0].ClientKey, "the client key never goes upstream")
	assert.Equal(t, "gpt-image-2", images[0].Model)

	rows, _, err := h.store.Requests(ctx, store.RequestFilter{ThreadID: first.ThreadID})
	require.NoError(t, err)
	var imageRows []store.RequestRecord
	for _, r := range rows {
		assert.Equal(t, h.ids["a1"], r.AccountID, "every request of the thread, the image's too, on its account (%s)", r.Route)
		if r.Route == "images.generations" {
			imageRows = append(imageRows, r)
		}
	}
	require.Len(t, imageRows, 1, "the image is on the thread's page of the request log")
	assert.Equal(t, "gpt-image-2", imageRows[0].Model)
	assert.Equal(t, int64(imagePrice), imageRows[0].CostNanos, "one image at the price table's price per image")
	assert.False(t, imageRows[0].Unpriced)
}
