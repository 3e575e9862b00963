package store

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A database location is shown (logs, the console, errors) with every
// secret hidden: the user info's password and the secret query parameters,
// whatever their case or escaping.
func TestLocationStringHidesSecrets(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, in, want string }{
		{"user info", "postgres://u:s3cret@db:5432/x?sslmode=disable", "postgres://u:xxxxx@db:5432/x?sslmode=disable"},
		{"password parameter", "postgres://u@db/x?password=s3cret&sslmode=disable", "postgres://u@db/x?password=xxxxx&sslmode=disable"},
		{"both", "postgresql://u:s3cret@db/x?password=s3cret", "postgresql://u:xxxxx@db/x?password=xxxxx"},
		{"parameter name in capitals", "postgres://u@db/x?PassWord=s3cret", "postgres://u@db/x?PassWord=xxxxx"},
		{"key passphrase", "postgres://u@db/x?sslkey=/k.pem&sslpassword=s3cret", "postgres://u@db/x?sslkey=/k.pem&sslpassword=xxxxx"},
		{"escaped name", "postgres://u@db/x?pass%77ord=s3cret", "postgres://u@db/x?pass%77ord=xxxxx"},
		{"name with a space", "postgres://u@db/x?password%20=s3cret", "postgres://u@db/x?password%20=xxxxx"},
		{"name that does not unescape", "postgres://u@db/x?%zz=s3cret", "postgres://u@db/x?%zz=xxxxx"},
		{"repeated", "postgres://u@db/x?password=s3cret&password=s3cret2", "postgres://u@db/x?password=xxxxx&password=xxxxx"},
		{"other parameters kept", "postgres://db/x?application_name=s3cret&sslmode=require", "postgres://db/x?application_name=s3cret&sslmode=require"},
		{"sqlite", "sqlite:/var/lib/relay.db", "sqlite:/var/lib/relay.db"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			loc, err := ParseLocation(tc.in)
			require.NoError(t, err)
			assert.Equal(t, tc.want, loc.String())
		})
	}
	assert.Equal(t, "<unparseable url>", Location{Dialect: Postgres, DSN: "host=db password=s3cret"}.String(),
		"a DSN that is not a URL is not shown at all")
}

// ParseLocation's errors never quote the input, which may hold a password;
// a libpq key=value string is refused rather than taken for a file name.
func TestParseLocationErrorsHideSecrets(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, in, want string }{
		{"invalid port", "postgres://u:s3cret@db:port/x", "not a valid URL"},
		{"invalid escape", "postgres://u:s3%zzcret@db/x", "not a valid URL"},
		{"unescaped #", "postgres://u:12#s3cret@db/x", "'#'"},
		{"unsupported scheme", "mysql://u:s3cret@db/x?password=s3cret", `unsupported scheme "mysql"`},
		{"key=value string", "host=db user=u password=s3cret dbname=x", "key=value"},
		{"key=value, spaced", "dbname=x password = s3cret", "key=value"},
		{"key=value with a scheme in it", "host=db password=a://s3cret", "key=value"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseLocation(tc.in)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), "s3cret")
		})
	}
	loc, err := ParseLocation("sqlite:host=db.sqlite")
	require.NoError(t, err, "an explicit sqlite: path may look like anything")
	assert.Equal(t, SQLite, loc.Dialect)
}

// Driver errors are scrubbed of the location's secrets, and still match
// what they wrap.
func TestScrubHidesSecretsInDriverErrors(t *testing.T) {
	t.Parallel()
	loc, err := ParseLocation("postgres://u:p%40ss@db/x?sslpassword=k3y-s3cret")
	require.NoError(t, err)
	cause := errors.New("cannot connect with p@ss, p%40ss or k3y-s3cret")
	scrubbed := loc.scrub(fmt.Errorf("dial: %w", cause))
	assert.Equal(t, "dial: cannot connect with xxxxx, xxxxx or xxxxx", scrubbed.Error())
	assert.ErrorIs(t, scrubbed, cause)
	plain := errors.New("nothing secret")
	assert.Same(t, plain, loc.scrub(plain), "an error without secrets is passed on as it is")
	assert.NoError(t, loc.scrub(nil))
}

// A database that cannot be opened is named in the error without its
// passwords.
func TestOpenErrorHidesSecrets(t *testing.T) {
	t.Parallel()
	loc, err := ParseLocation("postgres://u:s3cret@127.0.0.1:1/x?password=s3cret2&sslmode=disable")
	require.NoError(t, err)
	_, err = Open(context.Background(), loc, Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "127.0.0.1:1")
	assert.NotContains(t, err.Error(), "s3cret")
}
