package main

import (
	"fmt"
	"io"

	"github.com/redis/go-redis/v9"
)

func runRealtime(o *options, rdb *redis.Client, stderr io.Writer) ([]*report, error) {
	return nil, fmt.Errorf("realtime: not implemented yet")
}
