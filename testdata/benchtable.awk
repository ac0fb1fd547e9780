# Turns `go test -bench` output into a table: one row per benchmark, one column per metric.
/^Benchmark/ {
	name = $1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
	rows[++n] = name
	for (i = 3; i < NF; i += 2) {
		unit = $(i + 1)
		if (!(unit in seen)) { seen[unit] = 1; units[++u] = unit }
		val[name, unit] = $i
	}
}
END {
	if (n == 0) { print "no benchmark results"; exit 1 }
	printf "\n%-34s", "benchmark"
	for (j = 1; j <= u; j++) printf " %16s", units[j]
	printf "\n"
	for (r = 1; r <= n; r++) {
		printf "%-34s", rows[r]
		for (j = 1; j <= u; j++) {
			v = val[rows[r], units[j]]
			printf " %16s", (v == "" ? "-" : v)
		}
		printf "\n"
	}
}
