package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
)

// maxSettingFile bounds what a _FILE variable or the configuration file may
// hold: a secret or a page of settings, never a whole disk by mistake.
const maxSettingFile = 1 << 20

// configure reads the configuration every command starts from, before any
// command parses its flags (their defaults come from it), and returns the
// arguments without -config and a cli whose getenv answers each setting by
// precedence:
//
//	flag > environment > *_FILE variable > configuration file > default
//
// The flags are applied later by each command (envOr gives their defaults),
// so this resolves the three middle layers: a setting's variable when set and
// not blank, else the trimmed content of the file its _FILE variable names,
// else its key in the file of -config FILE (or CODEX_RELAY_CONFIG). Variables
// that are not settings (HTTPS_PROXY, ...) pass through unchanged. Every file
// is read here, once, so a missing or empty secret file fails the command
// before it does anything.
func configure(args []string, c cli) ([]string, cli, error) {
	path, rest, err := splitConfigFlag(args)
	if err != nil {
		return nil, c, err
	}
	if path == "" {
		path = strings.TrimSpace(c.getenv(configEnv))
	}
	var fromFile map[string]string
	if path != "" {
		if fromFile, err = readConfigFile(path); err != nil {
			return nil, c, err
		}
	}
	values := make(map[string]string, len(settings))
	for _, s := range settings {
		if v := c.getenv(s.env); strings.TrimSpace(v) != "" {
			values[s.env] = v
			continue
		}
		if name := strings.TrimSpace(c.getenv(s.env + fileSuffix)); name != "" {
			v, err := readSettingFile(name)
			if err != nil {
				return nil, c, fmt.Errorf("%s%s: %w", s.env, fileSuffix, err)
			}
			values[s.env] = v
			continue
		}
		if v, ok := fromFile[s.env]; ok {
			values[s.env] = v
		}
	}
	getenv := c.getenv
	c.getenv = func(key string) string {
		if v, ok := values[key]; ok {
			return v
		}
		if _, ok := settingByEnv(key); ok {
			return ""
		}
		return getenv(key)
	}
	return rest, c, nil
}

// settingByEnv finds a setting by its variable.
func settingByEnv(env string) (setting, bool) {
	for _, s := range settings {
		if s.env == env {
			return s, true
		}
	}
	return setting{}, false
}

// splitConfigFlag takes -config FILE (also -config=FILE and the -- forms) out
// of args, wherever it stands before a "--": before the command name or among
// its flags.
func splitConfigFlag(args []string) (string, []string, error) {
	var path string
	found := false
	rest := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "config" {
			rest = append(rest, a)
			continue
		}
		if found {
			return "", nil, errors.New("-config: given more than once")
		}
		found = true
		if !hasValue {
			if i+1 >= len(args) {
				return "", nil, errors.New("-config: needs a file name")
			}
			i++
			value = args[i]
		}
		if strings.TrimSpace(value) == "" {
			return "", nil, errors.New("-config: needs a file name")
		}
		path = value
	}
	return path, rest, nil
}

// readSettingFile returns the trimmed content of the file a _FILE variable
// names; an empty one is an error, as a secret mounted empty is a mistake
// that must not start the relay without it.
func readSettingFile(name string) (string, error) {
	b, err := readLimited(name)
	if err != nil {
		return "", err
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", fmt.Errorf("%s is empty", name)
	}
	return v, nil
}

func readLimited(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSettingFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxSettingFile {
		return nil, fmt.Errorf("%s is larger than %d bytes", name, maxSettingFile)
	}
	return b, nil
}

// readConfigFile parses a YAML configuration file: one mapping whose keys are
// settings' keys (database_url for CODEX_RELAY_DATABASE_URL) and whose values
// are scalars; null leaves a setting unset. Unknown and repeated keys are
// refused, naming the key, so a typo cannot pass for a setting. A file that
// holds a credential must not be readable by other users.
func readConfigFile(path string) (map[string]string, error) {
	b, err := readLimited(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	values, secrets, err := parseConfig(b)
	if err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	if len(secrets) > 0 {
		st, err := os.Stat(path)
		if err != nil {
			return nil, fmt.Errorf("config file: %w", err)
		}
		if perm := st.Mode().Perm(); perm&0o007 != 0 {
			return nil, fmt.Errorf("config file %s holds %s but other users can read it (mode %04o): chmod 600 it, or give the secret in %s%s",
				path, secrets[0].key(), perm, secrets[0].env, fileSuffix)
		}
	}
	return values, nil
}

// parseConfig parses the configuration file's YAML into values by variable,
// and lists the settings among them that hold a credential.
func parseConfig(b []byte) (map[string]string, []setting, error) {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var doc yaml.Node
	if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
		return map[string]string{}, nil, nil
	} else if err != nil {
		return nil, nil, err
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, nil, errors.New("want one YAML document, found more")
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return map[string]string{}, nil, nil
	}
	if root.Kind != yaml.MappingNode {
		return nil, nil, fmt.Errorf("line %d: want a mapping of keys to values, such as \"database_url: postgres://...\"", root.Line)
	}
	values := make(map[string]string, len(root.Content)/2)
	seen := make(map[string]bool, len(root.Content)/2)
	var secrets []setting
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		key := k.Value
		s, ok := settingByKey(key)
		if !ok {
			hint := ""
			if base, isFile := strings.CutSuffix(key, strings.ToLower(fileSuffix)); isFile {
				if s, ok := settingByKey(base); ok {
					hint = fmt.Sprintf(" (a secret from a file: set %s%s in the environment, or give %s here)", s.env, fileSuffix, base)
				}
			}
			return nil, nil, fmt.Errorf("line %d: unknown key %q%s", k.Line, key, hint)
		}
		if seen[key] {
			return nil, nil, fmt.Errorf("line %d: key %q given twice", k.Line, key)
		}
		seen[key] = true
		if v.Kind == yaml.AliasNode && v.Alias != nil {
			v = v.Alias
		}
		if v.Kind != yaml.ScalarNode {
			return nil, nil, fmt.Errorf("line %d: key %q: want a single value, not a list or mapping", v.Line, key)
		}
		if v.Tag == "!!null" {
			continue
		}
		values[s.env] = v.Value
		if s.holdsSecret(v.Value) {
			secrets = append(secrets, s)
		}
	}
	return values, secrets, nil
}
