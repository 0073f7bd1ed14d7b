//go:build tools

// dranet, the DRA network driver plexus's DRA driver is measured beside (scripts/bench/dra.sh).
// Built by `scripts/peers.sh dranet`, never by the test command.
package tools

import _ "github.com/google/dranet/cmd/dranet"
