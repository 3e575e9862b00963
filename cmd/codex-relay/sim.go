package main

import (
	"context"
	"errors"
)

func runSim(ctx context.Context, c cli, args []string) error { return errors.New("sim: being written") }
