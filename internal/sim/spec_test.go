package sim

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseAccountSpec(t *testing.T) {
	t.Parallel()
	a, err := ParseAccountSpec("id=alice, kind=chatgpt,org=org-a,token=at,refresh=rt,account-id=cg,plan=pro,primary=12.5,secondary=3,usage-per-request=1,token-ttl=1h,revoke-old-token=0s,seal-messages,seal-tool-calls=false,email=a@x,label=Alice")
	require.NoError(t, err)
	assert.Equal(t, Account{
		ID: "alice", Label: "Alice", Kind: KindChatGPT, AccessToken: "at", RefreshToken: "rt", ChatGPTAccountID: "cg",
		Organization: "org-a", Email: "a@x", PlanType: "pro",
		Primary: Window{UsedPercent: 12.5, WindowMinutes: 300}, Secondary: Window{UsedPercent: 3, WindowMinutes: 10080},
		UsagePerRequest: 1, SealMessages: true, AccessTokenTTL: Duration(time.Hour), RevokeOldAccessToken: new(Duration(0)),
	}, a)

	for _, bad := range []string{"token=x", "id=a", "id=a,token=x,kind=azure", "id=a,token=x,colour=red", "id=a,token=x,primary=lots", "id=a,token=x,seal-messages=maybe"} {
		_, err := ParseAccountSpec(bad)
		assert.Error(t, err, bad)
	}
}

func TestParseFaultSpec(t *testing.T) {
	t.Parallel()
	f, err := ParseFaultSpec("kind=rate_limit,account=a,transport=ws,after=2,times=1,retry-after=3s,in-stream,prewarm")
	require.NoError(t, err)
	assert.Equal(t, Fault{Kind: FaultRateLimit, Account: "a", Transport: TransportWS, After: 2, Times: 1,
		RetryAfter: Duration(3 * time.Second), InStream: true, IncludePrewarm: true}, f)
	f, err = ParseFaultSpec("kind=websocket_max_age,max-age=50ms")
	require.NoError(t, err)
	assert.Equal(t, Duration(50*time.Millisecond), f.MaxAge)
	f, err = ParseFaultSpec("kind=stall,events=4")
	require.NoError(t, err)
	assert.Equal(t, 4, f.Events)
	f, err = ParseFaultSpec("kind=server_error,status=503,resets-in=1m")
	require.NoError(t, err)
	assert.Equal(t, 503, f.Status)

	for _, bad := range []string{"kind=nope", "kind=stall,after=x", "kind=stall,speed=3", "kind=unauthorized,in-stream", "kind=websocket_max_age"} {
		_, err := ParseFaultSpec(bad)
		assert.Error(t, err, bad)
	}
}

func TestLoadConfigFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	cf, err := LoadConfigFile(write("full.json", `{"accounts":[{"id":"a","access_token":"x","primary":{"used_percent":5,"resets_in":"2h"}}],
		"faults":[{"kind":"usage_limit","account":"a","after":1,"resets_in":600}]}`))
	require.NoError(t, err)
	require.Len(t, cf.Accounts, 1)
	assert.Equal(t, Duration(2*time.Hour), cf.Accounts[0].Primary.ResetsIn)
	require.Len(t, cf.Faults, 1)
	assert.Equal(t, Duration(10*time.Minute), cf.Faults[0].ResetsIn)

	cf, err = LoadConfigFile(write("list.json", `[{"id":"a","access_token":"x"},{"id":"b","access_token":"y","kind":"openai"}]`))
	require.NoError(t, err)
	assert.Len(t, cf.Accounts, 2)

	_, err = LoadConfigFile(write("typo.json", `{"acounts":[]}`))
	assert.Error(t, err)
	_, err = LoadConfigFile(write("bad-duration.json", `{"accounts":[{"id":"a","access_token":"x","access_token_ttl":"soon"}]}`))
	assert.Error(t, err)
	_, err = LoadConfigFile(filepath.Join(dir, "missing.json"))
	assert.Error(t, err)
}

func TestDurationJSON(t *testing.T) {
	t.Parallel()
	b, err := Duration(90 * time.Second).MarshalJSON()
	require.NoError(t, err)
	assert.Equal(t, `"1m30s"`, string(b))
	var d Duration
	require.NoError(t, d.UnmarshalJSON([]byte(`1.5`)))
	assert.Equal(t, Duration(1500*time.Millisecond), d)
	assert.Error(t, d.UnmarshalJSON([]byte(`true`)))
}
