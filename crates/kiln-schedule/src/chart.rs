//! A text chart of a simulated step: one row per stage, one column per time slot.

use std::fmt::Write;

use super::{Action, Schedule, Span, Timeline};

/// The widest chart drawn; slots grow beyond the shortest compute to keep within it.
const MAX_COLUMNS: usize = 240;

/// The time one column stands for: the longest `shortest / k` (`k` up to 12) on which
/// every compute starts and ends, else the shortest compute; never so short that the
/// chart would exceed [`MAX_COLUMNS`].
fn slot(compute: &[Span], step: f64) -> f64 {
    let Some(shortest) = compute.iter().map(|s| s.end - s.start).reduce(f64::min) else {
        return 1.0;
    };
    let floor = step / MAX_COLUMNS as f64;
    let on_grid = |time: f64, slot: f64| {
        let slots = time / slot;
        (slots - slots.round()).abs() < 1e-6
    };
    (1..=12)
        .map(|k| shortest / k as f64)
        .take_while(|&slot| slot >= floor)
        .find(|&slot| {
            compute
                .iter()
                .all(|s| on_grid(s.start, slot) && on_grid(s.end, slot))
        })
        .unwrap_or(shortest)
        .max(floor)
}

impl Schedule {
    /// Draws `timeline` (from [`simulate`](super::simulate) of this schedule) as text: a
    /// header, one row per stage whose cells are time slots showing `F3` / `B3` (forward /
    /// backward of micro-batch 3; `F3.1` on chunk 1 when interleaved) or dots when idle, and
    /// a legend. A slot is the longest that divides every compute's start and end, if one
    /// of the shortest compute ÷ 1, 2, …, 12 does and the chart stays within 240 columns;
    /// otherwise the shortest compute (longer if needed to keep within 240 columns), with
    /// times rounded to slots.
    ///
    /// # Panics
    ///
    /// If `timeline` does not have this schedule's shape.
    pub fn chart(&self, timeline: &Timeline) -> String {
        assert!(
            timeline.stages() == self.stages()
                && (0..self.stages()).all(|s| timeline.spans(s).len() == self.actions(s).len()),
            "the timeline is not a simulation of this schedule"
        );
        let step = timeline.step_time();
        let compute: Vec<_> = (0..self.stages())
            .flat_map(|s| self.actions(s).iter().zip(timeline.spans(s)))
            .filter(|(action, span)| action.is_compute() && span.end > span.start)
            .map(|(_, span)| *span)
            .collect();
        let slot = slot(&compute, step);
        let columns = ((step / slot) - 1e-9).ceil().max(0.0) as usize;
        let interleaved = self.chunks() > 1;
        let label = |action: &Action| {
            let (letter, micro, chunk) = match *action {
                Action::Forward { micro, chunk } => ('F', micro, chunk),
                Action::Backward { micro, chunk } => ('B', micro, chunk),
                _ => return None,
            };
            Some(if interleaved {
                format!("{letter}{micro}.{chunk}")
            } else {
                format!("{letter}{micro}")
            })
        };
        let rows: Vec<Vec<Option<String>>> = (0..self.stages())
            .map(|stage| {
                let mut cells = vec![None; columns];
                for (action, span) in self.actions(stage).iter().zip(timeline.spans(stage)) {
                    let Some(text) = label(action) else { continue };
                    let first = (span.start / slot).round() as usize;
                    let end = ((span.end / slot).round() as usize).max(first + 1);
                    for cell in cells.iter_mut().take(end).skip(first) {
                        *cell = Some(text.clone());
                    }
                }
                cells
            })
            .collect();
        let width = rows
            .iter()
            .flatten()
            .flatten()
            .map(String::len)
            .fold(2, usize::max);
        let stage_width = (self.stages() - 1).to_string().len();
        let mut chart = format!(
            "{} schedule, {} stages, {} micro-batches: step time {}, bubble {:.1}%\n",
            self.kind(),
            self.stages(),
            self.micro_batches(),
            step,
            100.0 * timeline.bubble_fraction()
        );
        let idle = ".".repeat(width);
        for (stage, cells) in rows.iter().enumerate() {
            let _ = write!(chart, "stage {stage:>stage_width$} |");
            for cell in cells {
                let _ = write!(chart, " {:<width$}", cell.as_deref().unwrap_or(&idle));
            }
            chart.push('\n');
        }
        let (forward, backward) = if interleaved {
            (
                "F3.1: forward of micro-batch 3 on chunk 1",
                "B3.1: backward",
            )
        } else {
            ("F3: forward of micro-batch 3", "B3: backward")
        };
        let unit = if slot == 1.0 { "" } else { "s" };
        let _ = writeln!(
            chart,
            "{forward}, {backward}, {idle}: idle; one column = {slot} time unit{unit}"
        );
        chart
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;

    fn chart(kind: ScheduleKind, stages: usize, micro_batches: usize) -> String {
        let schedule = Schedule::new(kind, stages, micro_batches).unwrap();
        let timeline = simulate(&schedule, &Costs::uniform(1.0, 2.0)).unwrap();
        schedule.chart(&timeline)
    }

    #[test]
    fn gpipe_chart_with_two_stages_and_four_micro_batches() {
        // Forwards take 1, backwards 2: stage 1 starts a slot late, and stage 0 waits for
        // each gradient from stage 1. Step (M + P − 1)·3 = 15, each stage idle 3 of it.
        let expected = "\
gpipe schedule, 2 stages, 4 micro-batches: step time 15, bubble 20.0%
stage 0 | F0 F1 F2 F3 .. .. .. B0 B0 B1 B1 B2 B2 B3 B3
stage 1 | .. F0 F1 F2 F3 B0 B0 B1 B1 B2 B2 B3 B3 .. ..
F3: forward of micro-batch 3, B3: backward, ..: idle; one column = 1 time unit
";
        assert_eq!(chart(ScheduleKind::GPipe, 2, 4), expected);
    }

    #[test]
    fn one_f_one_b_chart_with_two_stages_and_four_micro_batches() {
        // Stage 0 warms up with one forward more than stage 1, then both alternate; same
        // step time and bubble as GPipe, with at most 2 micro-batches held instead of 4.
        let expected = "\
1f1b schedule, 2 stages, 4 micro-batches: step time 15, bubble 20.0%
stage 0 | F0 F1 .. .. B0 B0 F2 B1 B1 F3 B2 B2 .. B3 B3
stage 1 | .. F0 B0 B0 F1 B1 B1 F2 B2 B2 F3 B3 B3 .. ..
F3: forward of micro-batch 3, B3: backward, ..: idle; one column = 1 time unit
";
        assert_eq!(chart(ScheduleKind::OneFOneB, 2, 4), expected);
    }

    #[test]
    fn interleaved_cells_name_the_chunk() {
        let text = chart(ScheduleKind::Interleaved { virtual_stages: 2 }, 2, 4);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "interleaved:2 schedule, 2 stages, 4 micro-batches: step time 27, bubble 11.1%"
        );
        assert!(lines[1].starts_with("stage 0 | F0.0 F1.0 F0.1 F1.1 F2.0 .... B0.1 B0.1"));
        assert!(lines[2].starts_with("stage 1 | .... F0.0 F1.0 F0.1 B0.1 B0.1 F1.1"));
        assert!(lines[3].starts_with("F3.1: forward of micro-batch 3 on chunk 1"));
    }

    #[test]
    fn slots_divide_uneven_costs_and_transfers() {
        let schedule = Schedule::new(ScheduleKind::OneFOneB, 3, 4).unwrap();
        let costs = Costs::uniform(1.5, 2.5).with_transfer(0.5);
        let timeline = simulate(&schedule, &costs).unwrap();
        let text = schedule.chart(&timeline);
        assert!(text.ends_with("one column = 0.5 time units\n"), "{text}");
        // Stage 2's first forward starts after two forwards and two transfers: at 4.
        let row = text.lines().nth(3).unwrap();
        assert!(
            row.starts_with("stage 2 | .. .. .. .. .. .. .. .. F0 F0 F0 B0"),
            "{row}"
        );
        let columns = row.split_whitespace().count() - 3;
        assert_eq!(columns as f64 * 0.5, timeline.step_time());
    }
}
