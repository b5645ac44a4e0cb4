fn main() {
    println!("quantshadow");
}
