module github.com/hybridlimit/hybridlimit/sim

go 1.26.0

require github.com/hybridlimit/hybridlimit v0.0.0

replace github.com/hybridlimit/hybridlimit => ../
