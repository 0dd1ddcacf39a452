package throttle

import "github.com/redis/go-redis/v9"

// NewExampleClient gives the external example package the examples' server.
func NewExampleClient() *redis.Client { return exampleClient() }
