package web

import (
	"testing"

	"github.com/oauth2-proxy/mockoidc"
)

// StartOIDCProvider runs an OpenID provider (mockoidc) on localhost with a
// sign-in page of its own, for the browser tests of package web_test.
func StartOIDCProvider(t *testing.T) *mockoidc.MockOIDC { return startProviderWith(t, true) }
