package sim

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ParseAccountSpec parses the compact account form used on command lines:
// comma-separated key=value pairs, for example
//
//	id=alice,kind=chatgpt,org=org-a,token=at-alice,refresh=rt-alice
//
// Keys: id, label, kind (chatgpt|openai), token (access token), refresh
// (refresh token), account-id (ChatGPT-Account-Id), org, email, plan,
// primary and secondary (used percent), usage-per-request, token-ttl and
// revoke-old-token (durations), and the flags seal-messages, seal-tool-calls.
func ParseAccountSpec(spec string) (Account, error) {
	var a Account
	err := parseSpec(spec, func(k, v string) error {
		var err error
		switch k {
		case "id":
			a.ID = v
		case "label":
			a.Label = v
		case "kind":
			a.Kind = Kind(v)
		case "token", "access-token":
			a.AccessToken = v
		case "refresh", "refresh-token":
			a.RefreshToken = v
		case "account-id", "chatgpt-account-id":
			a.ChatGPTAccountID = v
		case "org", "organization", "organisation":
			a.Organization = v
		case "email":
			a.Email = v
		case "plan":
			a.PlanType = v
		case "primary":
			a.Primary.UsedPercent, err = strconv.ParseFloat(v, 64)
		case "secondary":
			a.Secondary.UsedPercent, err = strconv.ParseFloat(v, 64)
		case "usage-per-request":
			a.UsagePerRequest, err = strconv.ParseFloat(v, 64)
		case "token-ttl":
			a.AccessTokenTTL, err = parseDuration(v)
		case "revoke-old-token":
			var d Duration
			d, err = parseDuration(v)
			a.RevokeOldAccessToken = &d
		case "seal-messages":
			a.SealMessages, err = parseFlag(v)
		case "seal-tool-calls":
			a.SealToolCalls, err = parseFlag(v)
		default:
			return fmt.Errorf("unknown key %q", k)
		}
		return err
	})
	if err != nil {
		return Account{}, fmt.Errorf("account %q: %w", spec, err)
	}
	a.withDefaults()
	if err := a.validate(); err != nil {
		return Account{}, err
	}
	return a, nil
}

// ParseFaultSpec parses the compact fault form used on command lines, for
// example
//
//	kind=usage_limit,account=alice,after=2
//	kind=server_error,status=503,times=1,in-stream
//
// Keys: kind, account, transport (http|ws), after, times, status, events,
// retry-after, resets-in, max-age (durations), and the flags in-stream and
// prewarm (IncludePrewarm).
func ParseFaultSpec(spec string) (Fault, error) {
	var f Fault
	err := parseSpec(spec, func(k, v string) error {
		var err error
		switch k {
		case "kind":
			f.Kind = FaultKind(v)
		case "account":
			f.Account = v
		case "transport":
			f.Transport = Transport(v)
		case "after":
			f.After, err = strconv.Atoi(v)
		case "times":
			f.Times, err = strconv.Atoi(v)
		case "status":
			f.Status, err = strconv.Atoi(v)
		case "events":
			f.Events, err = strconv.Atoi(v)
		case "retry-after":
			f.RetryAfter, err = parseDuration(v)
		case "resets-in":
			f.ResetsIn, err = parseDuration(v)
		case "max-age":
			f.MaxAge, err = parseDuration(v)
		case "in-stream":
			f.InStream, err = parseFlag(v)
		case "prewarm":
			f.IncludePrewarm, err = parseFlag(v)
		default:
			return fmt.Errorf("unknown key %q", k)
		}
		return err
	})
	if err != nil {
		return Fault{}, fmt.Errorf("fault %q: %w", spec, err)
	}
	if err := f.validate(); err != nil {
		return Fault{}, err
	}
	return f, nil
}

// ConfigFile is the JSON file form of a sim's accounts and faults. A file
// may also hold a bare list of accounts.
type ConfigFile struct {
	Accounts []Account `json:"accounts"`
	Faults   []Fault   `json:"faults,omitempty"`
}

// LoadConfigFile reads a ConfigFile (or a JSON list of accounts) from path.
// Unknown fields are errors, so a misspelt option does not pass silently.
func LoadConfigFile(path string) (ConfigFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return ConfigFile{}, fmt.Errorf("read sim config: %w", err)
	}
	var cf ConfigFile
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if strings.HasPrefix(strings.TrimSpace(string(b)), "[") {
		err = dec.Decode(&cf.Accounts)
	} else {
		err = dec.Decode(&cf)
	}
	if err != nil {
		return ConfigFile{}, fmt.Errorf("parse sim config %s: %w", path, err)
	}
	return cf, nil
}

func parseSpec(spec string, set func(k, v string) error) error {
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		k, v, hasValue := strings.Cut(part, "=")
		if !hasValue {
			v = "true" // a bare key is a flag
		}
		if err := set(strings.TrimSpace(k), strings.TrimSpace(v)); err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
	}
	return nil
}

func parseDuration(v string) (Duration, error) {
	d, err := time.ParseDuration(v)
	return Duration(d), err
}

func parseFlag(v string) (bool, error) { return strconv.ParseBool(v) }
