package relay

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/codexrelay/codex-relay/continuity"
	"github.com/codexrelay/codex-relay/internal/store"
)

func TestPolice(t *testing.T) {
	aliases := map[string]string{"fast": "gpt-5.1-codex-mini"}
	cases := []struct {
		name    string
		key     store.ClientKey
		body    string
		want    string // the body upstream ("" unchanged)
		note    string
		refused string // the refusal's code
	}{
		{"no policy: unchanged", store.ClientKey{}, `{"model":"m","reasoning":{"effort":"xhigh"},"service_tier":"priority"}`, "", "", ""},
		{"an alias becomes its model", store.ClientKey{Policy: store.KeyPolicy{ModelAliases: aliases}},
			`{"model": "fast","input":[]}`, `{"model": "gpt-5.1-codex-mini","input":[]}`, "model fast>gpt-5.1-codex-mini", ""},
		{"an alias is allowed beside an allow-list", store.ClientKey{Models: []string{"gpt-5.1-codex"}, Policy: store.KeyPolicy{ModelAliases: aliases}},
			`{"model":"fast"}`, `{"model":"gpt-5.1-codex-mini"}`, "model fast>gpt-5.1-codex-mini", ""},
		{"outside the allow-list and the aliases", store.ClientKey{Models: []string{"gpt-5.1-codex"}, Policy: store.KeyPolicy{ModelAliases: aliases}},
			`{"model":"gpt-5.2"}`, "", "", "model_not_allowed"},
		{"effort above the cap is lowered, other reasoning fields kept", store.ClientKey{Policy: store.KeyPolicy{MaxReasoningEffort: "medium"}},
			`{"model":"m","reasoning":{"summary":"auto","effort":"high"}}`, `{"model":"m","reasoning":{"effort":"medium","summary":"auto"}}`, "effort high>medium", ""},
		{"effort at the cap is kept", store.ClientKey{Policy: store.KeyPolicy{MaxReasoningEffort: "medium"}},
			`{"model":"m","reasoning":{"effort":"medium"}}`, "", "", ""},
		{"effort below the cap is kept", store.ClientKey{Policy: store.KeyPolicy{MaxReasoningEffort: "high"}},
			`{"model":"m","reasoning":{"effort":"minimal"}}`, "", "", ""},
		{"an unknown effort is capped", store.ClientKey{Policy: store.KeyPolicy{MaxReasoningEffort: "low"}},
			`{"model":"m","reasoning":{"effort":"ultra"}}`, `{"model":"m","reasoning":{"effort":"low"}}`, "effort ultra>low", ""},
		{"no reasoning: nothing to cap", store.ClientKey{Policy: store.KeyPolicy{MaxReasoningEffort: "low"}},
			`{"model":"m"}`, "", "", ""},
		{"priority downgraded", store.ClientKey{Policy: store.KeyPolicy{PriorityTier: "downgrade"}},
			`{"model":"m","service_tier":"priority","stream":true}`, `{"model":"m","stream":true}`, "tier priority>default", ""},
		{"flex is not priority", store.ClientKey{Policy: store.KeyPolicy{PriorityTier: "refuse"}},
			`{"model":"m","service_tier":"flex"}`, "", "", ""},
		{"priority refused", store.ClientKey{Policy: store.KeyPolicy{PriorityTier: "refuse"}},
			`{"model":"m","service_tier":"priority"}`, "", "", "service_tier_not_allowed"},
		{"all at once", store.ClientKey{Policy: store.KeyPolicy{ModelAliases: aliases, MaxReasoningEffort: "low", PriorityTier: "downgrade"}},
			`{"service_tier":"priority","model":"fast","reasoning":{"effort":"high"}}`, `{"model":"gpt-5.1-codex-mini","reasoning":{"effort":"low"}}`,
			"model fast>gpt-5.1-codex-mini; effort high>low; tier priority>default", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fields, err := continuity.RequestFields([]byte(c.body))
			require.NoError(t, err)
			cl := client{key: c.key, keyed: true}
			out, err := cl.police([]byte(c.body), fields)
			if c.refused != "" {
				var re *requestError
				require.ErrorAs(t, err, &re)
				assert.Equal(t, http.StatusForbidden, re.status)
				assert.Equal(t, c.refused, re.err.Code)
				return
			}
			require.NoError(t, err)
			want := c.want
			if want == "" {
				want = c.body
			}
			assert.JSONEq(t, want, string(out.body))
			if c.want == "" {
				assert.Equal(t, c.body, string(out.body), "unchanged to the byte")
			}
			assert.Equal(t, c.note, out.note)
			assert.Equal(t, fields.Model, out.asked)
			got, err := continuity.RequestFields(out.body)
			require.NoError(t, err)
			assert.Equal(t, got.Model, out.fields.Model, "the fields say what goes upstream")
		})
	}
}

func TestWithMember(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"a":1,"model":"x","b":2}`, `{"a":1,"model":"y","b":2}`},
		{`{"a":1}`, `{"model":"y","a":1}`},
		{`{}`, `{"model":"y"}`},
		{` { } `, ` {"model":"y" } `},
	} {
		assert.Equal(t, c.want, string(withMember([]byte(c.in), "model", "y")))
	}
}
