# Turns `go test -bench` output into a table: one row per benchmark, one column per metric.
# Benchmarks report different metrics, so the table is cut into sections: a header line
# whenever the metrics change, naming the columns of the rows below it (each column as wide
# as its name). Sub-benchmarks keep their path (OneChange/endpoint/nodes=1000); the
# GOMAXPROCS suffix (-2) is dropped.
/^Benchmark/ {
	name = $1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
	rows[++n] = name
	cols[n] = 0
	for (i = 3; i < NF; i += 2) {
		unit = $(i + 1)
		units[n, ++cols[n]] = unit
		val[n, unit] = $i
	}
}
function header(r,    j, w) {
	printf "\n%-34s", "benchmark"
	for (j = 1; j <= cols[r]; j++) {
		w = length(units[r, j]); if (w < 12) w = 12
		printf(" %" w "s", units[r, j])
	}
	printf "\n"
}
function same(a, b,    j) {
	if (cols[a] != cols[b]) return 0
	for (j = 1; j <= cols[a]; j++) if (units[a, j] != units[b, j]) return 0
	return 1
}
END {
	if (n == 0) { print "no benchmark results"; exit 1 }
	for (r = 1; r <= n; r++) {
		if (r == 1 || !same(r, r - 1)) header(r)
		printf "%-34s", rows[r]
		for (j = 1; j <= cols[r]; j++) {
			w = length(units[r, j]); if (w < 12) w = 12
			printf(" %" w "s", val[r, units[r, j]])
		}
		printf "\n"
	}
}
