package store

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
)

// Proxy is an account's outbound proxy: every request the relay sends for
// the account (Responses over HTTP and WebSocket, token refresh, usage
// polls) goes through it. The zero value is no proxy.
//
// The URL may carry a user and password; it is sealed at rest like the
// credentials, and a Proxy prints (fmt, slog, String) only its display form,
// with the password replaced by ***. The full URL is handed out by URL alone,
// to the code that dials.
type Proxy struct {
	display string // without the password; "" for none
	full    string // the URL as given, password included; "" when none or not readable
	err     error  // why a stored proxy could not be read (then full is "")
}

// proxySchemes are the proxy kinds an account may name: HTTP and HTTPS
// proxies (CONNECT for https upstreams) and SOCKS5, which Go's HTTP
// transport all speak.
var proxySchemes = map[string]bool{"http": true, "https": true, "socks5": true, "socks5h": true}

// ParseProxy validates an account's proxy URL: scheme http, https, socks5
// or socks5h, a host and a port, optionally user:password@, and nothing
// else (no path, query or fragment). "" is no proxy. Its errors never quote
// the URL, which may hold a password.
func ParseProxy(raw string) (Proxy, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return Proxy{}, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return Proxy{}, errors.New("proxy_url: not a valid URL (a password with reserved characters must be percent-encoded)")
	}
	if !proxySchemes[strings.ToLower(u.Scheme)] {
		return Proxy{}, errors.New("proxy_url: the scheme must be http, https, socks5 or socks5h")
	}
	if u.Opaque != "" || u.Hostname() == "" {
		return Proxy{}, errors.New("proxy_url: a host is required (scheme://[user:password@]host:port)")
	}
	port := u.Port()
	if n, err := strconv.Atoi(port); port == "" || err != nil || n < 1 || n > 65535 {
		return Proxy{}, errors.New("proxy_url: a port (1-65535) is required")
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return Proxy{}, errors.New("proxy_url: must not have a path, query or fragment")
	}
	u.Scheme, u.Path = strings.ToLower(u.Scheme), ""
	return Proxy{display: displayProxy(u), full: u.String()}, nil
}

// displayProxy is u without its password: scheme://user:***@host:port.
func displayProxy(u *url.URL) string {
	d := *u
	if d.User != nil {
		if _, ok := d.User.Password(); ok {
			return d.Scheme + "://" + url.User(d.User.Username()).String() + ":***@" + d.Host
		}
	}
	return d.String()
}

// IsZero reports whether p is no proxy.
func (p Proxy) IsZero() bool { return p.display == "" }

// String is the display form: the URL without its password ("" for none).
func (p Proxy) String() string { return p.display }

// Format prints the display form whatever the verb, so a Proxy inside an
// Account printed with %v or %+v shows no password.
func (p Proxy) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(p.display)) }

// LogValue logs the display form.
func (p Proxy) LogValue() slog.Value { return slog.StringValue(p.display) }

// URL returns the proxy to dial through: nil for none, an error when the
// account names a proxy that could not be read (the relay then sends
// nothing for it rather than go direct). The result is a fresh copy.
func (p Proxy) URL() (*url.URL, error) {
	if p.err != nil {
		return nil, p.err
	}
	if p.display == "" {
		return nil, nil
	}
	u, err := url.Parse(p.full)
	if err != nil || p.full == "" {
		return nil, errors.New("proxy_url: unreadable")
	}
	return u, nil
}

// Redact returns err with the proxy's password (and its full URL) hidden
// from its text, for errors of requests sent through p: a dial error may
// name the proxy it dialed. It keeps err's chain for errors.Is and As.
func (p Proxy) Redact(err error) error {
	if err == nil || p.full == "" {
		return err
	}
	u, perr := url.Parse(p.full)
	if perr != nil || u.User == nil {
		return err
	}
	pw, ok := u.User.Password()
	if !ok || pw == "" {
		return err
	}
	msg := err.Error()
	clean := redactProxy(msg, p, u, pw)
	if clean == msg {
		return err
	}
	return &redactedError{msg: clean, err: err}
}

func redactProxy(msg string, p Proxy, u *url.URL, pw string) string {
	msg = strings.ReplaceAll(msg, p.full, p.display)
	msg = strings.ReplaceAll(msg, u.User.String()+"@", url.User(u.User.Username()).String()+":***@")
	for _, s := range []string{pw, url.QueryEscape(pw), url.PathEscape(pw)} {
		msg = strings.ReplaceAll(msg, s, "***")
	}
	return msg
}

// redactedError is an error whose text had a proxy password taken out.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// proxyAAD binds an account's sealed proxy URL to its row (and apart from
// its credentials: one ciphertext cannot stand in for the other).
func proxyAAD(id string) []byte { return []byte("account-proxy:" + id) }

// sealProxy returns the sealed and display columns of p for account id.
func (s *Store) sealProxy(id string, p Proxy) (sealed, display string, err error) {
	if p.IsZero() {
		return "", "", nil
	}
	if p.full == "" {
		return "", "", errors.New("proxy_url: not readable, so not stored (give the URL again)")
	}
	if s.sealer == nil {
		return "", "", ErrNoSecretKey
	}
	sealed, err = s.sealer.Seal([]byte(p.full), proxyAAD(id))
	if err != nil {
		return "", "", err
	}
	return sealed, p.display, nil
}

// openProxy reads an account's proxy from its columns. One that cannot be
// opened keeps its display form and carries the error, so the account
// lists as before but nothing is sent for it.
func (s *Store) openProxy(id, sealed, display string) Proxy {
	if sealed == "" {
		return Proxy{}
	}
	if display == "" {
		display = "(proxy)"
	}
	if s.sealer == nil {
		return Proxy{display: display, err: fmt.Errorf("account %s: proxy_url: %w", id, ErrNoSecretKey)}
	}
	pt, err := s.sealer.Open(sealed, proxyAAD(id))
	if err != nil {
		return Proxy{display: display, err: fmt.Errorf("account %s: proxy_url: %w", id, err)}
	}
	p, err := ParseProxy(string(pt))
	if err != nil {
		return Proxy{display: display, err: fmt.Errorf("account %s: %w", id, err)}
	}
	return p
}
