//! The layers x configurations heatmap as a plain SVG (no script, no external resource), so it
//! renders inline on GitHub and in any browser.
//!
//! Cell colour is the site's minimum cosine on a log scale of 1 - cosine, fixed from 1e-7
//! (green) to 1 (red) so that colours mean the same in every report. Failing cells get a thick
//! outline: a magnitude bug (the FP8 fn/fnuz factor of 2) keeps cosine at 1.0 and would look
//! healthy by colour alone. Each cell carries a `<title>` tooltip with its numbers.

use super::model::{HeatmapCell, Report, SiteStatus};
use super::text::{self, xml};
use std::fmt::Write;

const CELL_WIDTH: f64 = 92.0;
const CELL_HEIGHT: f64 = 20.0;
/// Advance of one character of the 11 px monospace labels (an upper bound for common fonts).
const CHAR_WIDTH: f64 = 6.8;
const MARGIN: f64 = 12.0;
const TITLE_HEIGHT: f64 = 28.0;
const LEGEND_HEIGHT: f64 = 86.0;
const LEGEND_BAR_WIDTH: f64 = 320.0;
/// log10(1 - cosine) range of the colour scale.
const LOG_MIN: f64 = -7.0;
const LOG_MAX: f64 = 0.0;

/// Colour ramp stops (position on the scale, RGB): green while errors are at bf16/FP8 noise
/// levels, yellow around the FP4 bounds, red towards uncorrelated output.
const RAMP: [(f64, [u8; 3]); 6] = [
    (0.0, [0, 104, 55]),
    (0.3, [26, 152, 80]),
    (0.5, [166, 217, 106]),
    (0.65, [254, 224, 139]),
    (0.8, [252, 141, 89]),
    (1.0, [215, 48, 39]),
];
const NAN_FILL: &str = "#7b3294";
const OBSERVED_FILL: &str = "#d9d9d9";
const MISSING_FILL: &str = "#ffffff";

/// Position of a cosine on the colour scale, 0 (perfect) to 1 (uncorrelated or worse).
pub fn scale_position(cosine: f64) -> f64 {
    let error = (1.0 - cosine).clamp(10f64.powf(LOG_MIN), 10f64.powf(LOG_MAX));
    (error.log10() - LOG_MIN) / (LOG_MAX - LOG_MIN)
}

fn ramp_colour(position: f64) -> String {
    let t = position.clamp(0.0, 1.0);
    let upper = RAMP.iter().position(|(p, _)| *p >= t).unwrap_or(RAMP.len() - 1).max(1);
    let ((p0, c0), (p1, c1)) = (RAMP[upper - 1], RAMP[upper]);
    let f = if p1 > p0 { (t - p0) / (p1 - p0) } else { 0.0 };
    let mix = |a: u8, b: u8| (a as f64 + (b as f64 - a as f64) * f).round() as u8;
    format!("#{:02x}{:02x}{:02x}", mix(c0[0], c1[0]), mix(c0[1], c1[1]), mix(c0[2], c1[2]))
}

/// Fill, text colour and cell text of one cell.
fn cell_look(cell: Option<&HeatmapCell>) -> (String, &'static str, String) {
    let Some(cell) = cell else {
        return (MISSING_FILL.into(), "#888888", "–".into());
    };
    match (cell.status, cell.cosine_min) {
        (SiteStatus::Observed, _) | (_, None) => (OBSERVED_FILL.into(), "#333333", "obs".into()),
        (status, Some(cosine)) if cosine.is_nan() => (
            NAN_FILL.into(),
            "#ffffff",
            if status == SiteStatus::Fail { "NaN ✗".into() } else { "NaN".into() },
        ),
        (status, Some(cosine)) => {
            let position = scale_position(cosine);
            // White on the dark ends of the ramp, black on the light middle.
            let ink = if (0.12..=0.85).contains(&position) { "#111111" } else { "#ffffff" };
            let mark = if status == SiteStatus::Fail { " ✗" } else { "" };
            (ramp_colour(position), ink, format!("{}{mark}", text::cosine(cosine)))
        }
    }
}

fn tooltip(site: &str, column: &str, cell: Option<&HeatmapCell>) -> String {
    let Some(cell) = cell else {
        return format!("{site} | {column}: not seen in this configuration");
    };
    match (cell.cosine_min, cell.nmse_max) {
        (Some(cosine), Some(nmse)) => format!(
            "{site} | {column}: min cosine {}, max NMSE {}, {} checked calls, {} failing: {}",
            text::cosine(cosine),
            text::sci(nmse),
            cell.calls_checked,
            cell.calls_failed,
            cell.status.name()
        ),
        _ => format!("{site} | {column}: observed, never checked"),
    }
}

/// Renders the heatmap of `report` as a standalone SVG document.
pub fn render_heatmap_svg(report: &Report) -> String {
    let heatmap = &report.heatmap;
    // An unnamed site's key already ends in its ordinal.
    let row_labels: Vec<String> = heatmap
        .rows
        .iter()
        .map(|r| if r.named { format!("#{} {}", r.ordinal, r.site) } else { r.site.clone() })
        .collect();
    let label_width =
        row_labels.iter().map(|l| l.chars().count()).max().unwrap_or(0) as f64 * CHAR_WIDTH + 8.0;
    let longest_column = heatmap.columns.iter().map(|c| c.chars().count()).max().unwrap_or(0) as f64;
    // Column labels are rotated by 45 degrees: they rise by their length / sqrt(2).
    let header_height = longest_column * CHAR_WIDTH * std::f64::consts::FRAC_1_SQRT_2 + 16.0;
    let grid_x = MARGIN + label_width;
    let grid_y = MARGIN + TITLE_HEIGHT + header_height;
    let grid_width = CELL_WIDTH * heatmap.columns.len() as f64;
    let grid_height = CELL_HEIGHT * heatmap.rows.len() as f64;
    let width = (grid_x + grid_width + header_height).max(MARGIN * 2.0 + LEGEND_BAR_WIDTH + 260.0).ceil();
    let height = (grid_y + grid_height + LEGEND_HEIGHT + MARGIN).ceil();

    let mut svg = String::with_capacity(512 + 400 * heatmap.rows.len() * heatmap.columns.len().max(1));
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="ui-monospace, SFMono-Regular, Menlo, Consolas, monospace" font-size="11">"#
    );
    let _ = writeln!(svg, "<title>quantshadow: minimum cosine per site and configuration</title>");
    let _ = writeln!(svg, r##"<rect width="{width}" height="{height}" fill="#ffffff"/>"##);
    let _ = writeln!(
        svg,
        r#"<text x="{MARGIN}" y="{}" font-size="14" font-weight="bold">Minimum cosine per site and configuration</text>"#,
        MARGIN + 16.0
    );

    for (column, label) in heatmap.columns.iter().enumerate() {
        let x = grid_x + CELL_WIDTH * (column as f64 + 0.5);
        let y = grid_y - 6.0;
        let _ = writeln!(
            svg,
            r#"<text x="{x:.1}" y="{y:.1}" transform="rotate(-45 {x:.1} {y:.1})">{}</text>"#,
            xml(label)
        );
    }
    for (index, (row, label)) in heatmap.rows.iter().zip(&row_labels).enumerate() {
        let y = grid_y + CELL_HEIGHT * index as f64;
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            grid_x - 6.0,
            y + CELL_HEIGHT * 0.7,
            xml(label)
        );
        for (column, cell) in row.cells.iter().enumerate() {
            let x = grid_x + CELL_WIDTH * column as f64;
            let cell = cell.as_ref();
            let (fill, ink, value) = cell_look(cell);
            let failing = cell.is_some_and(|c| c.status == SiteStatus::Fail);
            let stroke = if failing {
                r##"stroke="#000000" stroke-width="2.5""##
            } else {
                r##"stroke="#ffffff" stroke-width="1""##
            };
            let _ = writeln!(
                svg,
                r#"<g><title>{}</title><rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{fill}" {stroke}/><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10" fill="{ink}">{}</text></g>"#,
                xml(&tooltip(&row.site, &heatmap.columns[column], cell)),
                x + 1.25,
                y + 1.25,
                CELL_WIDTH - 2.5,
                CELL_HEIGHT - 2.5,
                x + CELL_WIDTH / 2.0,
                y + CELL_HEIGHT * 0.68,
                xml(&value)
            );
        }
    }
    // Tick labels are centred on their ticks: the first one needs room to its left.
    write_legend(&mut svg, MARGIN + 16.0, grid_y + grid_height + 30.0);
    svg.push_str("</svg>\n");
    svg
}

fn write_legend(svg: &mut String, x: f64, y: f64) {
    let _ = writeln!(svg, "<defs><linearGradient id=\"qs-scale\" x1=\"0\" x2=\"1\" y1=\"0\" y2=\"0\">");
    for (position, [r, g, b]) in RAMP {
        let _ = writeln!(svg, r#"<stop offset="{position}" stop-color="rgb({r},{g},{b})"/>"#);
    }
    let _ = writeln!(svg, "</linearGradient></defs>");
    let _ = writeln!(svg, r#"<text x="{x}" y="{:.1}">1 − cosine (log scale)</text>"#, y - 6.0);
    let _ = writeln!(
        svg,
        r##"<rect x="{x}" y="{y:.1}" width="{LEGEND_BAR_WIDTH}" height="12" fill="url(#qs-scale)" stroke="#888888"/>"##
    );
    let steps = (LOG_MAX - LOG_MIN) as i32;
    for step in 0..=steps {
        let exponent = LOG_MIN as i32 + step;
        let tick_x = x + LEGEND_BAR_WIDTH * step as f64 / steps as f64;
        let _ = writeln!(
            svg,
            r##"<line x1="{tick_x:.1}" y1="{:.1}" x2="{tick_x:.1}" y2="{:.1}" stroke="#444444"/><text x="{tick_x:.1}" y="{:.1}" text-anchor="middle" font-size="10">1e{exponent}</text>"##,
            y + 12.0,
            y + 16.0,
            y + 27.0
        );
    }
    let swatch_y = y + 40.0;
    let swatches: [(&str, &str, &str); 4] = [
        ("#ffffff", r##"stroke="#000000" stroke-width="2.5""##, "failing (✗)"),
        (NAN_FILL, r##"stroke="#ffffff""##, "NaN"),
        (OBSERVED_FILL, r##"stroke="#ffffff""##, "observed only"),
        (MISSING_FILL, r##"stroke="#888888""##, "not seen"),
    ];
    let mut swatch_x = x;
    for (fill, stroke, label) in swatches {
        let _ = writeln!(
            svg,
            r#"<rect x="{swatch_x:.1}" y="{swatch_y:.1}" width="18" height="12" fill="{fill}" {stroke}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            swatch_x + 24.0,
            swatch_y + 10.0,
            xml(label)
        );
        swatch_x += 24.0 + label.chars().count() as f64 * CHAR_WIDTH + 18.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_scale_is_logarithmic_in_one_minus_cosine() {
        assert_eq!(scale_position(1.0), 0.0);
        assert_eq!(scale_position(0.0), 1.0);
        assert_eq!(scale_position(-0.5), 1.0);
        assert!((scale_position(0.999) - 4.0 / 7.0).abs() < 1e-12);
        assert!(scale_position(0.99999) < scale_position(0.999));
        assert_eq!(ramp_colour(0.0), "#006837");
        assert_eq!(ramp_colour(1.0), "#d73027");
        assert_eq!(ramp_colour(0.65), "#fee08b");
    }
}
