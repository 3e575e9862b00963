package app

import (
	"testing"

	"github.com/codexrelay/codex-relay/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }
