import Foundation

/// Two panels: delivered events/s vs subscribers (dense fan-out), and p99
/// latency vs update rate, Concord next to Redis. Plain SVG, no dependencies.
func chartSVG(dense: [(subs: Int, concord: Double, redis: Double)], latency: [(rate: Int, concord: Double, redis: Double)]) -> String {
    let w = 920.0, h = 380.0, pad = 60.0, panel = (w - 3 * pad) / 2
    var s = ##"<svg xmlns="http://www.w3.org/2000/svg" width="\##(Int(w))" height="\##(Int(h))" font-family="sans-serif" font-size="12">"##
    s += ##"<rect width="100%" height="100%" fill="white"/>"##
    func bars(x0: Double, title: String, labels: [String], a: [Double], b: [Double], unit: String) {
        let top = 40.0, bottom = h - 50
        let maxV = max((a + b).max() ?? 1, 1)
        s += ##"<text x="\##(x0 + panel / 2)" y="24" text-anchor="middle" font-weight="bold">\##(title)</text>"##
        s += ##"<line x1="\##(x0)" y1="\##(bottom)" x2="\##(x0 + panel)" y2="\##(bottom)" stroke="black"/>"##
        s += ##"<line x1="\##(x0)" y1="\##(top)" x2="\##(x0)" y2="\##(bottom)" stroke="black"/>"##
        for k in 0...4 {
            let v = maxV * Double(k) / 4
            let y = bottom - (bottom - top) * Double(k) / 4
            s += ##"<text x="\##(x0 - 6)" y="\##(y + 4)" text-anchor="end">\##(short(v))</text>"##
            s += ##"<line x1="\##(x0)" y1="\##(y)" x2="\##(x0 + panel)" y2="\##(y)" stroke="#ddd"/>"##
        }
        let group = panel / Double(max(labels.count, 1))
        for (i, label) in labels.enumerated() {
            let gx = x0 + group * Double(i) + group * 0.15
            let bw = group * 0.35
            for (j, (v, color)) in [(a[i], "#2b6cb0"), (b[i], "#c53030")].enumerated() {
                let bh = (bottom - top) * v / maxV
                s += ##"<rect x="\##(gx + bw * Double(j))" y="\##(bottom - bh)" width="\##(bw)" height="\##(bh)" fill="\##(color)"/>"##
            }
            s += ##"<text x="\##(gx + bw)" y="\##(bottom + 16)" text-anchor="middle">\##(label)</text>"##
        }
        s += ##"<text x="\##(x0 + panel / 2)" y="\##(h - 14)" text-anchor="middle">\##(unit)</text>"##
    }
    bars(x0: pad, title: "Dense fan-out: delivered events/s", labels: dense.map { "\($0.subs) subs" },
         a: dense.map(\.concord), b: dense.map(\.redis), unit: "subscriber connections (100 channels each)")
    bars(x0: 2 * pad + panel, title: "p99 latency (µs), 100k subscriptions", labels: latency.map { "\($0.rate)/s" },
         a: latency.map(\.concord), b: latency.map(\.redis), unit: "update rate")
    s += ##"<rect x="\##(w - 190)" y="40" width="12" height="12" fill="#2b6cb0"/><text x="\##(w - 172)" y="50">Concord</text>"##
    s += ##"<rect x="\##(w - 110)" y="40" width="12" height="12" fill="#c53030"/><text x="\##(w - 92)" y="50">Redis</text>"##
    s += "</svg>\n"
    return s
}

private func short(_ v: Double) -> String {
    if v >= 1e6 { return String(format: "%.1fM", v / 1e6) }
    if v >= 1e3 { return String(format: "%.0fk", v / 1e3) }
    return String(format: "%.0f", v)
}
