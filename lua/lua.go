// Package lua holds the project's Redis Lua scripts. Each script is its own
// .lua file, embedded here; rules.lua holds the rule kinds and is prepended to
// the scripts that use them, so they share code by composition.
package lua

import _ "embed"

//go:embed rules.lua
var rules string

//go:embed admit.lua
var admit string

//go:embed release.lua
var release string

//go:embed pause.lua
var pause string

// Admit returns the source of the admission script (rules.lua + admit.lua).
func Admit() string { return rules + admit }

// Release returns the source of the release script (rules.lua + release.lua).
func Release() string { return rules + release }

// Pause returns the source of the bucket pause script (rules.lua + pause.lua).
func Pause() string { return rules + pause }
