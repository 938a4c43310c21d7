package main

import "github.com/codemode-go/codemode/edge/cmd/stackbench/plot"

// plotSeries takes from rows the closed-loop python print(1) runs of the
// agent and of each door of the plain edge.
func plotSeries(rows []row) []plot.Series {
	var out []plot.Series
	for _, name := range append([]string{"agent"}, doors...) {
		s := plot.Series{Name: name}
		for _, c := range plot.Concs() {
			for _, r := range rows {
				if r.target == name && r.mode == "closed" && r.conc == c && r.workload == jobPrint.kind && r.p50 > 0 {
					s.Conc = append(s.Conc, c)
					s.P50 = append(s.P50, ms(r.p50))
					s.P99 = append(s.P99, ms(r.p99))
				}
			}
		}
		if len(s.Conc) > 0 {
			out = append(out, s)
		}
	}
	return out
}

// workloadBars takes from rows each item's p50 at concurrency 1.
func workloadBars(rows []workRow) []plot.Bars {
	res := &results{work: rows}
	var out []plot.Bars
	for _, it := range workloadItems {
		get := func(stack, mode string) float64 {
			r, _ := findWork(res, it.kind, stack, mode, 1)
			return ms(r.p50)
		}
		b := plot.Bars{Item: it.kind, PreloadPaced: get(stackPreload, "paced"), FreshPaced: get(stackFresh, "paced"),
			PreloadClosed: get(stackPreload, "closed"), FreshClosed: get(stackFresh, "closed")}
		if b.PreloadClosed > 0 || b.FreshClosed > 0 || b.PreloadPaced > 0 || b.FreshPaced > 0 {
			out = append(out, b)
		}
	}
	return out
}
