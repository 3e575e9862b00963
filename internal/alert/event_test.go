package alert

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The signature is the hex HMAC-SHA256 of the raw body: a known vector
// (RFC 4231's second case), and any change of body or secret fails it.
func TestSign(t *testing.T) {
	assert.Equal(t, "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", Sign("Jefe", []byte("what do ya want for nothing?")))
	body := []byte(`{"id":"evt_1"}`)
	sig := Sign("s3cret", body)
	assert.True(t, Verify("s3cret", body, sig))
	assert.False(t, Verify("other", body, sig))
	assert.False(t, Verify("s3cret", []byte(`{"id":"evt_2"}`), sig))
}

func TestBody(t *testing.T) {
	ev := Event{ID: "evt_1", Type: AccountNeedsLogin, At: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
		Subject: map[string]any{"account_id": "acc_1", "label": "team"},
		Data:    map[string]any{"state": Fired, "message": "Account team needs a new login."}}
	payload, err := json.Marshal(ev)
	require.NoError(t, err)
	got, err := Body(FormatJSON, payload)
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":"evt_1","type":"account.needs_login","at":"2026-12-01T00:00:00Z",
		"subject":{"account_id":"acc_1","label":"team"},"data":{"state":"fired","message":"Account team needs a new login."}}`, string(got))

	got, err = Body(FormatSlack, payload)
	require.NoError(t, err)
	assert.JSONEq(t, `{"text":":rotating_light: *account.needs_login* fired: Account team needs a new login. (account_id=acc_1, label=team)"}`, string(got))
	ev.Data["state"] = Cleared
	payload, _ = json.Marshal(ev)
	got, err = Body(FormatSlack, payload)
	require.NoError(t, err)
	assert.Contains(t, string(got), ":white_check_mark:")
}
