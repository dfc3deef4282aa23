package store

import "fmt"

// check validates the shape of r before a store runs it.
func (r *TakeRequest) check() error {
	n := len(r.Rules)
	switch {
	case n == 0:
		return fmt.Errorf("store: TakeRequest has no rules")
	case len(r.Keys) != 2*n:
		return fmt.Errorf("store: TakeRequest has %d keys for %d rules, want %d", len(r.Keys), n, 2*n)
	case len(r.ExpireAt) != n:
		return fmt.Errorf("store: TakeRequest has %d expiries for %d rules", len(r.ExpireAt), n)
	case len(r.Counts) != 2*n:
		return fmt.Errorf("store: TakeRequest has room for %d counts, want %d", len(r.Counts), 2*n)
	case r.Cost < 0:
		return fmt.Errorf("store: TakeRequest cost %d is negative", r.Cost)
	}
	for i, rule := range r.Rules {
		if rule.WindowMs <= 0 {
			return fmt.Errorf("store: TakeRequest rule %d window %d ms is not positive", i, rule.WindowMs)
		}
	}
	return nil
}
