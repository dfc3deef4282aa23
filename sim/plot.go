package main

import (
	"fmt"
	"image/color"
	"io"
	"os"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// writePlot draws two panels into file (SVG or PNG by extension): the
// overshoot of every async configuration against its sync rate, with the
// local and synchronous modes as horizontal lines; and the admitted
// requests per second over time of every configuration, beside the ideal
// and the limit.
func writePlot(file string, o *options, reports []*report) error {
	left, err := overshootPlot(o, reports)
	if err != nil {
		return err
	}
	right, err := seriesPlot(o, reports)
	if err != nil {
		return err
	}
	w, h := vg.Points(1100), vg.Points(420)
	var c vg.CanvasWriterTo
	if strings.HasSuffix(file, ".png") {
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(110))}
	} else {
		c = vgsvg.New(w, h)
	}
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Points(24), PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(10)}
	plots := [][]*plot.Plot{{left, right}}
	canvases := plot.Align(plots, tiles, draw.New(c))
	left.Draw(canvases[0][0])
	right.Draw(canvases[0][1])
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("writing %s: %w", file, err)
	}
	return f.Close()
}

func overshootPlot(o *options, reports []*report) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Admitted over the ideal vs sync rate (%d nodes, %s)", o.Nodes, o.Pattern)
	p.X.Label.Text = "sync rate (ms, log scale)"
	p.Y.Label.Text = "admitted over the ideal (%; below 0: under-admission)"
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	// One line per async policy.
	byPolicy := map[string]plotter.XYs{}
	var policies []string
	lo, hi := 1e18, 0.0
	for _, r := range reports {
		if r.Mode == "async" {
			if _, ok := byPolicy[r.Policy]; !ok {
				policies = append(policies, r.Policy)
			}
			byPolicy[r.Policy] = append(byPolicy[r.Policy], plotter.XY{X: r.SyncRateMs, Y: r.OvershootPct})
			lo, hi = min(lo, r.SyncRateMs), max(hi, r.SyncRateMs)
		}
	}
	if len(policies) == 0 {
		lo, hi = 1, 1000
	}
	if lo == hi {
		lo, hi = lo/2, hi*2
	}
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.X.Min, p.X.Max = lo/1.5, hi*1.5
	for k, pol := range policies {
		pts := byPolicy[pol]
		sortXY(pts)
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, err
		}
		line.Color, points.Color = plotutil.Color(k), plotutil.Color(k)
		line.Width = vg.Points(2)
		p.Add(line, points)
		p.Legend.Add("async, "+pol+" policy", line, points)
		labels, err := plotter.NewLabels(plotter.XYLabels{XYs: pts, Labels: pctLabels(pts)})
		if err == nil {
			p.Add(labels)
		}
	}
	k := len(policies)
	for _, r := range reports {
		if r.Mode == "async" {
			continue
		}
		hl, err := plotter.NewLine(plotter.XYs{{X: p.X.Min, Y: r.OvershootPct}, {X: p.X.Max, Y: r.OvershootPct}})
		if err != nil {
			return nil, err
		}
		hl.Color = plotutil.Color(k)
		hl.Dashes = plotutil.Dashes(k)
		hl.Width = vg.Points(1.5)
		k++
		p.Add(hl)
		p.Legend.Add(fmt.Sprintf("%s (%+.1f%%)", r.label, r.OvershootPct), hl)
	}
	// Room above the data for the legend.
	top := 0.0
	for _, r := range reports {
		top = max(top, r.OvershootPct)
	}
	p.Y.Max = max(top*1.3, 1)
	bottom := 0.0
	for _, r := range reports {
		bottom = min(bottom, r.OvershootPct)
	}
	p.Y.Min = min(bottom*1.3, -1)
	return p, nil
}

func pctLabels(pts plotter.XYs) []string {
	var out []string
	for _, pt := range pts {
		out = append(out, fmt.Sprintf(" %+.1f%%", pt.Y))
	}
	return out
}

func sortXY(pts plotter.XYs) {
	for i := 1; i < len(pts); i++ {
		for j := i; j > 0 && pts[j].X < pts[j-1].X; j-- {
			pts[j], pts[j-1] = pts[j-1], pts[j]
		}
	}
}

func seriesPlot(o *options, reports []*report) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Admitted requests per second over time"
	p.X.Label.Text = "time (s)"
	p.Y.Label.Text = "admitted per second"
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	per := o.Bucket.Seconds()
	xy := func(s []int64) plotter.XYs {
		pts := make(plotter.XYs, len(s))
		for i, v := range s {
			pts[i] = plotter.XY{X: float64(i) * per, Y: float64(v) / per}
		}
		return pts
	}
	for i, r := range reports {
		l, err := plotter.NewLine(xy(r.series))
		if err != nil {
			return nil, err
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.2)
		p.Add(l)
		p.Legend.Add(r.label, l)
	}
	if len(reports) > 0 {
		l, err := plotter.NewLine(xy(reports[0].idealSeries))
		if err != nil {
			return nil, err
		}
		l.Color = color.Black
		l.Width = vg.Points(1.5)
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
		p.Legend.Add("ideal (exact limiter)", l)
	}
	limit := float64(o.Keys) * perSecond(tightest(o.Rules))
	ll, err := plotter.NewLine(plotter.XYs{{X: 0, Y: limit}, {X: o.Duration.Seconds(), Y: limit}})
	if err != nil {
		return nil, err
	}
	ll.Color = color.RGBA{R: 200, A: 255}
	ll.Width = vg.Points(1)
	ll.Dashes = []vg.Length{vg.Points(1), vg.Points(2)}
	p.Add(ll)
	p.Legend.Add(fmt.Sprintf("limit × keys (%.0f/s)", limit), ll)
	top := limit
	for _, r := range reports {
		for _, v := range r.series {
			top = max(top, float64(v)/per)
		}
	}
	p.Y.Min, p.Y.Max = 0, top*1.45
	return p, nil
}

var _ io.WriterTo = (*vgsvg.Canvas)(nil)
