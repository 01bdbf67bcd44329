# READ, batch 1: pdx (ucx backend)
$d0_0 << EOD
8448 3.8
65536 13.3
1.04858e+06 154
EOD
# READ, batch 1: raw UCP, peer error handling
$d0_1 << EOD
8448 3.8
65536 13
1.04858e+06 142.2
EOD
# READ, batch 1: raw UCP, bare
$d0_2 << EOD
8448 3.5
65536 12.9
1.04858e+06 141.8
EOD
# WRITE, batch 1: pdx (ucx backend)
$d1_0 << EOD
8448 3.8
65536 14.2
1.04858e+06 176.7
EOD
# WRITE, batch 1: raw UCP, peer error handling
$d1_1 << EOD
8448 3.7
65536 14.1
1.04858e+06 164.3
EOD
# WRITE, batch 1: raw UCP, bare
$d1_2 << EOD
8448 3.7
65536 14
1.04858e+06 161.4
EOD
set terminal svg size 1320,720 dynamic noenhanced font 'Helvetica,12'
set output "./bench-latency.svg"
set grid
set key below font ',10'
set logscale x 2
set format x '%.0b%BB'
set logscale y 10
set xlabel "message size"
set ylabel "p50 us"
set multiplot layout 1,2 title "pdx-bench latency: one request at a time over UCX"
set title "READ, batch 1"
plot $d0_0 using 1:2 with linespoints dt 1 lw 2 title "pdx (ucx backend)", $d0_1 using 1:2 with linespoints dt 2 lw 2 title "raw UCP, peer error handling", $d0_2 using 1:2 with linespoints dt 2 lw 2 title "raw UCP, bare"
set title "WRITE, batch 1"
plot $d1_0 using 1:2 with linespoints dt 1 lw 2 title "pdx (ucx backend)", $d1_1 using 1:2 with linespoints dt 2 lw 2 title "raw UCP, peer error handling", $d1_2 using 1:2 with linespoints dt 2 lw 2 title "raw UCP, bare"
unset multiplot
