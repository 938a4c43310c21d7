package preload

import "testing"

func TestNamesModule(t *testing.T) {
	mods := []string{"numpy", "pandas", "matplotlib.pyplot"}
	for code, want := range map[string]bool{
		"print(1)":                          false,
		"import pandas as pd":               true,
		"from matplotlib import pyplot":     true,
		"import numpyx, mynumpy, numpy_ext": false,
		"x = 1\nimport os, numpy":           true,
		"pandas":                            true,
		"print('matplotlib.pyplot')":        true,
		"":                                  false,
	} {
		if got := NamesModule(code, mods); got != want {
			t.Errorf("NamesModule(%q) = %v, want %v", code, got, want)
		}
	}
}
