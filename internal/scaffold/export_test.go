package scaffold

// FailAfter makes Generate fail after n of its final moves, to prove that a
// failure halfway changes nothing.
func FailAfter(cfg *Config, n int) { cfg.failAfter = n }
