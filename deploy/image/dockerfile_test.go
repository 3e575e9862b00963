package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
	"unicode"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd  string // upper case
	args string
}

func parseDockerfile(t *testing.T, path string) []instruction {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var out []instruction
	var cur strings.Builder
	for _, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if strings.HasPrefix(trimmed, "#") {
			continue // a comment inside a continued instruction
		}
		if body, ok := strings.CutSuffix(trimmed, "\\"); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{strings.ToUpper(cmd), strings.TrimSpace(args)})
		cur.Reset()
	}
	require.Zero(t, cur.Len(), "a continuation line ends the file")
	return out
}

// words splits Dockerfile arguments at spaces outside double quotes, and
// removes the quotes.
func words(s string) []string {
	var out []string
	var cur strings.Builder
	quoted, started := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted, started = !quoted, true
		case unicode.IsSpace(r) && !quoted:
			if started {
				out = append(out, cur.String())
				cur.Reset()
				started = false
			}
		default:
			cur.WriteRune(r)
			started = true
		}
	}
	if started {
		out = append(out, cur.String())
	}
	return out
}

// pairs parses key=value words (ENV, LABEL), substituting ${ARG}s.
func pairs(t *testing.T, args string, vars map[string]string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, w := range words(args) {
		k, v, ok := strings.Cut(w, "=")
		require.True(t, ok, "%q: want key=value", w)
		m[k] = os.Expand(v, func(name string) string { return vars[name] })
	}
	return m
}

func jsonArray(t *testing.T, s string) []string {
	t.Helper()
	var a []string
	require.NoError(t, json.Unmarshal([]byte(s), &a), "want the exec (JSON) form: %s", s)
	return a
}

// The Dockerfile and the daemonless builder make the same image: its final
// stage says what imageConfig says (user, entrypoint, command, environment,
// port, volume, health check, labels, stop signal), its build stage compiles
// the binary the same way, and both put the binary and /data at the same
// places with the same owner.
func TestDockerfileMatchesImage(t *testing.T) {
	t.Parallel()
	ins := parseDockerfile(t, "../../Dockerfile")
	last := -1
	for i, in := range ins {
		if in.cmd == "FROM" {
			last = i
		}
	}
	require.Positive(t, last, "a multi-stage build")
	m := metadata{version: "v1.2.3-test", commit: "0123abcd", source: defaultSource}
	want := imageConfig(m, time.Unix(0, 0))

	// The build stage.
	var build string
	for _, in := range ins[:last] {
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
			build = in.args
		}
	}
	require.NotEmpty(t, build, "the build stage runs go build")
	assert.Contains(t, build, "CGO_ENABLED=0", "a static binary")
	assert.Contains(t, build, "-trimpath")
	assert.Contains(t, build, `-ldflags "`+ldflags(metadata{version: "${VERSION}", commit: "${COMMIT}"})+`"`, "stamped as the builder stamps it")
	assert.Contains(t, build, mainPackage)
	assert.Contains(t, ins[0].args+" "+ins[1].args, "golang:${GO_VERSION}")

	// The final stage.
	final := ins[last:]
	assert.Contains(t, final[0].args, "distroless/static")
	assert.Contains(t, final[0].args, ":nonroot")
	vars := map[string]string{"VERSION": m.version, "COMMIT": m.commit}
	got := v1.Config{Labels: map[string]string{}}
	var copies []string
	for _, in := range final[1:] {
		switch in.cmd {
		case "ARG":
			k, v, _ := strings.Cut(in.args, "=")
			if _, set := vars[k]; !set {
				vars[k] = v
			}
		case "LABEL":
			for k, v := range pairs(t, in.args, vars) {
				got.Labels[k] = v
			}
		case "ENV":
			for k, v := range pairs(t, in.args, vars) {
				got.Env = append(got.Env, k+"="+v)
			}
		case "USER":
			got.User = in.args
		case "VOLUME":
			got.Volumes = map[string]struct{}{}
			for _, v := range jsonArray(t, in.args) {
				got.Volumes[v] = struct{}{}
			}
		case "EXPOSE":
			got.ExposedPorts = map[string]struct{}{}
			for _, p := range strings.Fields(in.args) {
				got.ExposedPorts[p] = struct{}{}
			}
		case "HEALTHCHECK":
			hc := &v1.HealthConfig{}
			rest := in.args
			for strings.HasPrefix(rest, "--") {
				var opt string
				opt, rest, _ = strings.Cut(rest, " ")
				rest = strings.TrimSpace(rest)
				k, v, _ := strings.Cut(strings.TrimPrefix(opt, "--"), "=")
				switch k {
				case "retries":
					require.NoError(t, json.Unmarshal([]byte(v), &hc.Retries))
				default:
					d, err := time.ParseDuration(v)
					require.NoError(t, err, opt)
					switch k {
					case "interval":
						hc.Interval = d
					case "timeout":
						hc.Timeout = d
					case "start-period":
						hc.StartPeriod = d
					default:
						t.Fatalf("HEALTHCHECK option %s", opt)
					}
				}
			}
			kind, cmd, _ := strings.Cut(rest, " ")
			require.Equal(t, "CMD", kind)
			hc.Test = append([]string{"CMD"}, jsonArray(t, cmd)...)
			got.Healthcheck = hc
		case "STOPSIGNAL":
			got.StopSignal = in.args
		case "ENTRYPOINT":
			got.Entrypoint = jsonArray(t, in.args)
		case "CMD":
			got.Cmd = jsonArray(t, in.args)
		case "COPY":
			copies = append(copies, in.args)
		default:
			t.Errorf("unexpected instruction in the final stage: %s %s", in.cmd, in.args)
		}
	}
	assert.ElementsMatch(t, want.Env, got.Env)
	got.Env = want.Env
	assert.Equal(t, want, got)
	assert.Contains(t, copies, "--from=build /out"+binaryPath+" "+binaryPath)
	assert.Contains(t, copies, "--from=build --chown=65532:65532 --chmod=0700 /out/data "+dataDir)
}
